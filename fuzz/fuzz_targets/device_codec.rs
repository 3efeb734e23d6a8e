//! The device annotation codec (`hami.io/vgpu-devices-to-allocate`): never a panic; what decodes
//! re-encodes to the same text; no decoded device ID holds a control character or white space.
#![no_main]

use hami_device_plugin::allocation::plan::codec::PodDevices;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(devices) = PodDevices::decode(text) {
        assert_eq!(devices.encode(), text);
        for i in 0..devices.len() {
            for d in devices.devices(i).unwrap_or(&[]) {
                assert!(
                    !d.uuid.is_empty()
                        && !d
                            .uuid
                            .contains(|c: char| c.is_control() || c.is_whitespace()),
                    "{:?}",
                    d.uuid
                );
            }
        }
    }
});
