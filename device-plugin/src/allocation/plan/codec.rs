//! The HAMi scheduler's device annotation `hami.io/vgpu-devices-to-allocate` (and its twin
//! `hami.io/vgpu-devices-allocated`), decoded and encoded exactly as HAMi's Go code does.
//!
//! Per device `UUID,TYPE,<memMiB>,<cores>:`; per container the concatenation of its devices,
//! terminated by `;`; one entry per init container, then one per container, **empty entries
//! kept** (containers without GPUs). Example: `GPU-aaa,NVIDIA,3000,50:;GPU-bbb,NVIDIA,4000,60:;`.
//!
//! The trailing `;`: HAMi's decoder is `strings.Split(value, ";")`, so the terminator of the last
//! entry yields one more, empty, entry after it. It is kept here too (it is never selected, being
//! empty), and [`PodDevices::encode`] joins the entries with `;`, so that `encode(decode(s)) == s`
//! for every value the scheduler writes and an erased entry becomes the empty string between its
//! neighbours' separators — what HAMi's `EncodePodSingleDevice` writes for the real containers,
//! without the extra `;` HAMi's own decode/erase/encode cycle appends on each call.
//!
//! Stricter than HAMi where HAMi silently reads garbage: a device with fewer than four fields, a
//! memory or core count that is not a decimal number (HAMi's `ParseInt` error is ignored and
//! becomes 0, i.e. **unlimited**), or a device without a UUID is an error naming the text.

use std::fmt;

use serde::Serialize;

/// Separator between containers (`OnePodMultiContainerSplitSymbol`).
pub const CONTAINER_SEPARATOR: char = ';';
/// Terminator of each device (`OneContainerMultiDeviceSplitSymbol`).
pub const DEVICE_SEPARATOR: char = ':';
/// The device type HAMi's NVIDIA plugin serves.
pub const NVIDIA: &str = "NVIDIA";

/// One device of a container as the scheduler assigned it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDevice {
    /// Physical GPU UUID (or a MIG device ID).
    pub uuid: String,
    /// Device type, `NVIDIA` for this plugin.
    #[serde(rename = "type")]
    pub kind: String,
    /// Memory in MiB (`Usedmem`).
    pub memory_mib: u64,
    /// Core percentage (`Usedcores`).
    pub cores: u32,
    /// Fields after the fourth (newer schedulers), kept verbatim for re-encoding.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<String>,
}

impl ContainerDevice {
    /// True for a device of this plugin's type.
    pub fn is_nvidia(&self) -> bool {
        self.kind == NVIDIA
    }

    fn encode_into(&self, out: &mut String) {
        out.push_str(&self.uuid);
        out.push(',');
        out.push_str(&self.kind);
        out.push(',');
        out.push_str(&self.memory_mib.to_string());
        out.push(',');
        out.push_str(&self.cores.to_string());
        for field in &self.extra {
            out.push(',');
            out.push_str(field);
        }
        out.push(DEVICE_SEPARATOR);
    }
}

/// The annotation could not be decoded; names the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed device {device:?} in container entry {entry} of {value:?}: {reason}")]
pub struct CodecError {
    /// The whole annotation value.
    pub value: String,
    /// Index of the container entry.
    pub entry: usize,
    /// The device text.
    pub device: String,
    /// What is wrong.
    pub reason: &'static str,
}

/// One container entry: its text as written and its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    text: String,
    devices: Vec<ContainerDevice>,
}

/// The decoded annotation: one entry per init container, then per container (and the empty piece
/// after the final `;`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDevices {
    entries: Vec<Entry>,
}

fn decimal<T: std::str::FromStr>(text: &str) -> Option<T> {
    // Decimal digits only: no sign, no space, no `0x` (Go's ParseInt(s, 10, 32)). Leading zeros
    // are read as decimal, as Go does; the value is re-rendered without them.
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The bytes a device ID (or type) may hold.
fn is_device_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/')
}

fn decode_entry(value: &str, index: usize, text: &str) -> Result<Vec<ContainerDevice>, CodecError> {
    let mut devices = Vec::new();
    for piece in text.split(DEVICE_SEPARATOR) {
        // HAMi skips pieces without a comma (the empty piece after the last `:`).
        if !piece.contains(',') {
            if piece.is_empty() {
                continue;
            }
            return Err(CodecError {
                value: value.to_owned(),
                entry: index,
                device: piece.to_owned(),
                reason: "expected UUID,TYPE,MEMORY,CORES",
            });
        }
        let err = |reason| CodecError {
            value: value.to_owned(),
            entry: index,
            device: piece.to_owned(),
            reason,
        };
        let fields: Vec<&str> = piece.split(',').collect();
        let [uuid, kind, memory, cores, extra @ ..] = fields.as_slice() else {
            return Err(err("fewer than 4 fields (UUID,TYPE,MEMORY,CORES)"));
        };
        if uuid.is_empty() {
            return Err(err("empty device UUID"));
        }
        // A device ID reaches NVIDIA_VISIBLE_DEVICES and the limits file: GPU-<uuid>, MIG-<uuid>
        // or MIG-GPU-<uuid>/<gi>/<ci>, nothing else (no control character, no white space).
        if !uuid.bytes().all(is_device_id_byte) {
            return Err(err(
                "the device UUID holds a character no device ID has (accepted: letters, digits, '-', '_', '.', '/')",
            ));
        }
        if kind.is_empty() {
            return Err(err("empty device type"));
        }
        if !kind.bytes().all(is_device_id_byte)
            || extra.iter().any(|f| {
                f.bytes()
                    .any(|b| b.is_ascii_control() || b.is_ascii_whitespace())
            })
        {
            return Err(err(
                "the device type or an extra field holds a control character or white space",
            ));
        }
        let memory_mib =
            decimal::<u64>(memory).ok_or_else(|| err("memory is not a decimal number of MiB"))?;
        let cores = decimal::<u32>(cores).ok_or_else(|| err("cores is not a decimal number"))?;
        devices.push(ContainerDevice {
            uuid: (*uuid).to_owned(),
            kind: (*kind).to_owned(),
            memory_mib,
            cores,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        });
    }
    Ok(devices)
}

impl PodDevices {
    /// Decodes an annotation value.
    pub fn decode(value: &str) -> Result<Self, CodecError> {
        let mut entries = Vec::new();
        for (index, text) in value.split(CONTAINER_SEPARATOR).enumerate() {
            entries.push(Entry {
                text: text.to_owned(),
                devices: decode_entry(value, index, text)?,
            });
        }
        Ok(Self { entries })
    }

    /// Builds the value the scheduler would write for these containers (each entry terminated).
    pub fn from_containers(containers: &[Vec<ContainerDevice>]) -> Self {
        let mut entries: Vec<Entry> = containers
            .iter()
            .map(|devices| {
                let mut text = String::new();
                for d in devices {
                    d.encode_into(&mut text);
                }
                Entry {
                    text,
                    devices: devices.clone(),
                }
            })
            .collect();
        entries.push(Entry {
            text: String::new(),
            devices: Vec::new(),
        });
        Self { entries }
    }

    /// The annotation value.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        for (i, entry) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(CONTAINER_SEPARATOR);
            }
            out.push_str(&entry.text);
        }
        out
    }

    /// Number of entries (including the empty piece after a final `;`).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there is no entry at all (never: `""` decodes to one empty entry).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The devices of entry `index`.
    pub fn devices(&self, index: usize) -> Option<&[ContainerDevice]> {
        self.entries.get(index).map(|e| e.devices.as_slice())
    }

    /// The first entry holding an NVIDIA device, with its NVIDIA devices (HAMi's
    /// `GetNextDeviceRequest`: init containers come first because their entries do).
    pub fn next_request(&self) -> Option<(usize, Vec<ContainerDevice>)> {
        self.entries.iter().enumerate().find_map(|(i, e)| {
            let nvidia: Vec<ContainerDevice> = e
                .devices
                .iter()
                .filter(|d| d.is_nvidia())
                .cloned()
                .collect();
            (!nvidia.is_empty()).then_some((i, nvidia))
        })
    }

    /// Removes the NVIDIA devices of entry `index` (HAMi's `EraseNextDeviceTypeFromAnnotation`);
    /// other types stay. Returns whether anything was removed.
    pub fn erase_nvidia(&mut self, index: usize) -> bool {
        let Some(entry) = self.entries.get_mut(index) else {
            return false;
        };
        let before = entry.devices.len();
        entry.devices.retain(|d| !d.is_nvidia());
        if entry.devices.len() == before {
            return false;
        }
        let mut text = String::new();
        for d in &entry.devices {
            d.encode_into(&mut text);
        }
        entry.text = text;
        true
    }

    /// True while some entry still holds an NVIDIA device (HAMi checks
    /// `strings.Contains(value, "NVIDIA")`; on a decoded value this is the same question).
    pub fn has_nvidia(&self) -> bool {
        self.entries
            .iter()
            .any(|e| e.devices.iter().any(ContainerDevice::is_nvidia))
    }
}

impl fmt::Display for PodDevices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

/// Which container an entry index names: entries run over init containers first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ContainerSlot {
    /// `spec.initContainers[i]`.
    Init(usize),
    /// `spec.containers[i]`.
    App(usize),
}

impl ContainerSlot {
    /// The slot of entry `index` for a pod with `n_init` init containers.
    pub fn of_entry(index: usize, n_init: usize) -> Self {
        if index < n_init {
            ContainerSlot::Init(index)
        } else {
            ContainerSlot::App(index - n_init)
        }
    }
}

/// UUIDs of the first entry with an NVIDIA device (for `GetPreferredAllocation`); empty when the
/// value is malformed or names no NVIDIA device.
pub fn next_request_uuids(value: &str) -> Vec<String> {
    PodDevices::decode(value)
        .ok()
        .and_then(|d| d.next_request())
        .map(|(_, devices)| devices.into_iter().map(|d| d.uuid).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(uuid: &str, mem: u64, cores: u32) -> ContainerDevice {
        ContainerDevice {
            uuid: uuid.into(),
            kind: NVIDIA.into(),
            memory_mib: mem,
            cores,
            extra: vec![],
        }
    }

    #[test]
    fn decodes_the_reference_example_with_hamis_trailing_entry() {
        let v = "GPU-aaa,NVIDIA,3000,50:;GPU-bbb,NVIDIA,4000,60:;";
        let d = PodDevices::decode(v).unwrap();
        assert_eq!(
            d.len(),
            3,
            "two containers and the piece after the final ';'"
        );
        assert_eq!(d.devices(0).unwrap(), [dev("GPU-aaa", 3000, 50)]);
        assert_eq!(d.devices(1).unwrap(), [dev("GPU-bbb", 4000, 60)]);
        assert!(d.devices(2).unwrap().is_empty());
        assert_eq!(d.encode(), v);
    }

    #[test]
    fn empty_entries_are_kept_and_round_trip() {
        for v in [
            "",
            ";",
            ";;",
            ";GPU-a,NVIDIA,1000,0:GPU-b,NVIDIA,2000,0:;;",
            "GPU-a,NVIDIA,1,2",
            "GPU-a,NVIDIA,3000,50,extra,x:;",
        ] {
            assert_eq!(PodDevices::decode(v).unwrap().encode(), v, "{v:?}");
        }
        let d = PodDevices::decode(";GPU-a,NVIDIA,1000,0:GPU-b,NVIDIA,2000,0:;;").unwrap();
        let (i, devices) = d.next_request().unwrap();
        assert_eq!(i, 1);
        assert_eq!(devices.len(), 2);
    }

    #[test]
    fn erase_empties_the_entry_and_keeps_the_rest() {
        let mut d = PodDevices::decode("GPU-a,NVIDIA,3000,50:;GPU-b,NVIDIA,4000,60:;").unwrap();
        assert!(d.erase_nvidia(0));
        assert_eq!(d.encode(), ";GPU-b,NVIDIA,4000,60:;");
        assert!(d.has_nvidia());
        assert_eq!(d.next_request().unwrap().0, 1);
        assert!(d.erase_nvidia(1));
        assert_eq!(d.encode(), ";;");
        assert!(!d.has_nvidia());
        assert!(d.next_request().is_none());
        assert!(!d.erase_nvidia(1));
        assert!(!d.erase_nvidia(9));
    }

    #[test]
    fn other_device_types_are_not_ours() {
        let mut d =
            PodDevices::decode("GPU-a,NVIDIA,3000,50:MLU-1,MLU,100,0:;;MLU-2,MLU,1,1:;").unwrap();
        assert_eq!(d.next_request().unwrap().1, [dev("GPU-a", 3000, 50)]);
        assert!(d.erase_nvidia(0));
        assert_eq!(d.encode(), "MLU-1,MLU,100,0:;;MLU-2,MLU,1,1:;");
        assert!(!d.has_nvidia());
    }

    #[test]
    fn leading_zeros_are_read_as_decimal_and_rewritten_without() {
        let mut d = PodDevices::decode("GPU-a,NVIDIA,04000,050:GPU-b,NVIDIA,1,0:;").unwrap();
        assert_eq!(d.devices(0).unwrap()[0], dev("GPU-a", 4000, 50));
        let rebuilt = PodDevices::from_containers(&[d.devices(0).unwrap().to_vec()]);
        assert_eq!(rebuilt.encode(), "GPU-a,NVIDIA,4000,50:GPU-b,NVIDIA,1,0:;");
        assert!(d.erase_nvidia(0));
        assert_eq!(d.encode(), ";");
    }

    #[test]
    fn malformed_values_are_errors_naming_the_text() {
        for (v, why) in [
            ("GPU-a,NVIDIA,3000:;", "fewer than 4"),
            ("GPU-a,NVIDIA,-1,50:;", "memory"),
            ("GPU-a,NVIDIA,3g,50:;", "memory"),
            ("GPU-a,NVIDIA, 3000,50:;", "memory"),
            ("GPU-a,NVIDIA,3000,x:;", "cores"),
            (",NVIDIA,3000,50:;", "UUID"),
            ("GPU-a,,3000,50:;", "type"),
            ("garbage;", "expected"),
        ] {
            let err = PodDevices::decode(v).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(why), "{v}: {text}");
            assert!(text.contains(&format!("{v:?}")), "{v}: {text}");
        }
    }

    #[test]
    fn device_ids_with_control_characters_or_spaces_are_refused() {
        for v in [
            "GPU-a\nb,NVIDIA,3000,50:;",
            "GPU-a\rb,NVIDIA,3000,50:;",
            "88\0,NVIDIA,3000,50:;",
            "GPU a,NVIDIA,3000,50:;",
            "GPU-a\t,NVIDIA,3000,50:;",
            "GPU-a,NVI DIA,3000,50:;",
            "GPU-a,NVIDIA,3000,50,x\ny:;",
            "GPU-a=b,NVIDIA,3000,50:;",
        ] {
            let e = PodDevices::decode(v).unwrap_err();
            assert!(e.to_string().contains("character"), "{v:?}: {e}");
        }
        let ok = "MIG-GPU-1f2e3d4c-5b6a/1/0,NVIDIA,3000,50:;GPU-1f2e_3.d,NVIDIA,1,1:;";
        assert_eq!(PodDevices::decode(ok).unwrap().encode(), ok);
    }

    #[test]
    fn from_containers_writes_hamis_encoding() {
        let d = PodDevices::from_containers(&[
            vec![],
            vec![dev("GPU-a", 3000, 50), dev("GPU-b", 1024, 0)],
        ]);
        assert_eq!(d.encode(), ";GPU-a,NVIDIA,3000,50:GPU-b,NVIDIA,1024,0:;");
    }

    #[test]
    fn slots_run_over_init_containers_first() {
        assert_eq!(ContainerSlot::of_entry(0, 2), ContainerSlot::Init(0));
        assert_eq!(ContainerSlot::of_entry(1, 2), ContainerSlot::Init(1));
        assert_eq!(ContainerSlot::of_entry(2, 2), ContainerSlot::App(0));
        assert_eq!(ContainerSlot::of_entry(0, 0), ContainerSlot::App(0));
    }

    #[test]
    fn next_request_uuids_for_preferred_allocation() {
        assert_eq!(
            next_request_uuids(";GPU-a,NVIDIA,3000,50:GPU-b,NVIDIA,3000,50:;GPU-c,NVIDIA,1,1:;"),
            ["GPU-a", "GPU-b"]
        );
        assert!(next_request_uuids(";;").is_empty());
        assert!(next_request_uuids("bad,").is_empty());
    }
}
