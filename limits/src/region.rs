//! `hami-limits region PATH`: HAMi-core's shared region of one container or of every container
//! of a node, the limits stamped in it, its processes and their usage, and the verdict against
//! the container's limits file.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use hami_shared::names::{LIMITS_FILE_SUFFIX, USAGE_CACHE_FILE};
use hami_shared::region::layout::{
    DEVICE_COUNT, DEVICE_MEMORY_SIZE, DEVICE_UTIL_SIZE, MAGIC_FLAG, SEM_SIZE, SLOT_COUNT, UUID_SIZE,
};
use hami_shared::region::{
    ContainerDir, ContainerVerdict, FileLimits, LAYOUTS, LimitsReadError, Liveness,
    MAX_REGION_FILE_BYTES, ProcSlot, Region, RegionError, container_dirs, judge, limits_file_for,
    read_limits_file, read_region_file,
};

/// Whose PIDs the slots' liveness is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PidView {
    /// `hostpid` in this PID namespace (the node's): run on the node.
    Host,
    /// `pid` in this PID namespace: run inside the container.
    Container,
    /// Do not check (no `stale` verdict).
    None,
}

/// What `region` was asked.
#[derive(Debug)]
pub struct RegionArgs {
    pub path: PathBuf,
    pub json: bool,
    pub limits: Option<PathBuf>,
    pub gpu_mib: Option<u64>,
    pub pids: PidView,
}

const EXIT_CLEAN: u8 = 0;
const EXIT_PROBLEM: u8 = 1;
const EXIT_UNREADABLE: u8 = 2;

/// One container to judge: its name, region file and limits file.
struct Target {
    name: String,
    region: PathBuf,
    limits: Option<PathBuf>,
}

/// PATH cannot be read or listed (`cannot read PATH: the error`, `cannot list PATH: …`).
#[derive(Debug)]
struct UnreadablePath {
    /// `read` or `list`.
    op: &'static str,
    path: PathBuf,
    source: std::io::Error,
}

impl std::fmt::Display for UnreadablePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot {} {}: {}",
            self.op,
            self.path.display(),
            self.source
        )
    }
}

/// PATH as a region file, a container folder or a folder of container folders.
fn targets(args: &RegionArgs) -> Result<Vec<Target>, UnreadablePath> {
    let path = &args.path;
    let meta = std::fs::metadata(path).map_err(|source| UnreadablePath {
        op: "read",
        path: path.clone(),
        source,
    });
    let is_dir = match (meta, std::fs::symlink_metadata(path)) {
        // A link named as the region file itself is judged (and refused) by the reader.
        (_, Ok(l)) if l.file_type().is_symlink() && !path.is_dir() => false,
        (Ok(m), _) => m.is_dir(),
        (Err(e), _) => return Err(e),
    };
    if !is_dir {
        let limits = args
            .limits
            .clone()
            .or_else(|| limits_file_for(path).filter(|p| std::fs::symlink_metadata(p).is_ok()));
        return Ok(vec![Target {
            name: container_name(path),
            region: path.clone(),
            limits,
        }]);
    }
    let region = path.join(USAGE_CACHE_FILE);
    let own_limits = path
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| path.with_file_name(format!("{n}{LIMITS_FILE_SUFFIX}")));
    let is_container = std::fs::symlink_metadata(&region).is_ok()
        || own_limits
            .as_ref()
            .is_some_and(|p| std::fs::symlink_metadata(p).is_ok());
    if is_container {
        return Ok(vec![Target {
            name: container_name(&region),
            region,
            limits: args.limits.clone().or(own_limits),
        }]);
    }
    let dirs = container_dirs(path).map_err(|source| UnreadablePath {
        op: "list",
        path: path.clone(),
        source,
    })?;
    Ok(dirs
        .into_iter()
        .map(
            |ContainerDir {
                 name,
                 region,
                 limits,
             }| Target {
                name,
                region,
                limits: Some(limits),
            },
        )
        .collect())
}

fn container_name(region: &Path) -> String {
    region.parent().and_then(Path::file_name).map_or_else(
        || region.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn liveness(view: PidView) -> impl Fn(&ProcSlot) -> Liveness {
    move |slot| {
        let pid = match view {
            PidView::Host => slot.hostpid,
            PidView::Container => slot.pid,
            PidView::None => 0,
        };
        if pid <= 0 {
            return Liveness::Unknown;
        }
        match std::fs::symlink_metadata(format!("/proc/{pid}")) {
            Ok(_) => Liveness::Alive,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Liveness::Dead,
            Err(_) => Liveness::Unknown,
        }
    }
}

/// One container, read and judged.
struct Judged {
    target: Target,
    region: Result<Region, RegionError>,
    limits_error: Option<LimitsReadError>,
    verdict: ContainerVerdict,
}

fn judge_target(target: Target, args: &RegionArgs) -> Judged {
    let region = read_region_file(&target.region);
    let (file, limits_error) = match target.limits.as_deref().map(read_limits_file) {
        None | Some(Ok(None)) => (None, None),
        Some(Ok(Some(parsed))) => (
            Some(FileLimits::from_entries(&parsed.entries, args.gpu_mib)),
            None,
        ),
        Some(Err(e)) => (None, Some(e)),
    };
    let verdict = judge(region.as_ref(), file.as_ref(), liveness(args.pids));
    Judged {
        target,
        region,
        limits_error,
        verdict,
    }
}

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} B")
    }
}

fn limit_text(bytes: u64) -> String {
    if bytes == 0 {
        "none".to_owned()
    } else {
        mib(bytes)
    }
}

fn write_human(out: &mut impl Write, j: &Judged) -> std::io::Result<()> {
    let v = &j.verdict;
    writeln!(out, "container {}: {}", j.target.name, v.verdict)?;
    writeln!(out, "  region: {}", j.target.region.display())?;
    match (&j.target.limits, &j.limits_error) {
        (_, Some(e)) => writeln!(out, "  limits file: unreadable: {e}")?,
        (Some(p), None) if std::fs::symlink_metadata(p).is_ok() => {
            writeln!(out, "  limits file: {}", p.display())?;
        }
        _ => writeln!(
            out,
            "  limits file: none (stamped limits reported, not compared)"
        )?,
    }
    writeln!(out, "  why: {}", v.reason)?;
    let Ok(r) = &j.region else {
        return Ok(());
    };
    let (prio, file_prio) = v
        .priority
        .map_or((r.priority, None), |p| (p.stamped, p.file));
    writeln!(
        out,
        "  layout {} ({} bytes), devices seen {}, priority {}{}",
        r.layout.version,
        r.length,
        r.device_num,
        prio,
        file_prio.map_or_else(String::new, |p| format!(" (file {p})"))
    )?;
    if let Some(u) = &v.utilization {
        writeln!(
            out,
            "  utilization switch {} (file policy {}): limiter {}",
            u.stamped_switch,
            u.file_policy.map_or("none", |p| match p {
                hami_shared::region::CorePolicyReading::Force => "force",
                hami_shared::region::CorePolicyReading::Disable => "disable",
                hami_shared::region::CorePolicyReading::Default => "default",
            }),
            if u.limiter_on { "on" } else { "off" }
        )?;
    }
    writeln!(
        out,
        "  {:<4} {:<10} {:>14} {:>14} {:>9} {:>14} {:>9}",
        "GPU", "verdict", "stamped limit", "file limit", "SM st/fi", "used", "processes"
    )?;
    for g in &v.gpus {
        writeln!(
            out,
            "  {:<4} {:<10} {:>14} {:>14} {:>9} {:>14} {:>9}",
            g.index,
            g.verdict.as_str(),
            limit_text(g.stamped_limit),
            g.file_limit.map_or_else(|| "-".to_owned(), limit_text),
            format!(
                "{}/{}",
                g.stamped_sm,
                g.file_sm.map_or_else(|| "-".to_owned(), |s| s.to_string())
            ),
            mib(g.used),
            g.processes
        )?;
    }
    writeln!(out, "  processes ({}):", r.procs.len())?;
    for (slot, report) in r.procs.iter().zip(&v.slots) {
        let used: Vec<String> = (0..DEVICE_COUNT)
            .filter(|d| slot.used[*d].total > 0)
            .map(|d| {
                format!(
                    "GPU {d} {} (context {})",
                    mib(slot.used[d].total),
                    mib(slot.used[d].context)
                )
            })
            .collect();
        writeln!(
            out,
            "    slot {}: pid {}, host pid {}, status {}, {}, {}",
            slot.slot,
            slot.pid,
            slot.hostpid,
            slot.status,
            match report.liveness {
                Liveness::Alive => "alive",
                Liveness::Dead => "GONE",
                Liveness::Unknown => "liveness unknown",
            },
            if used.is_empty() {
                "no usage".to_owned()
            } else {
                used.join(", ")
            }
        )?;
    }
    Ok(())
}

fn json_of(j: &Judged) -> serde_json::Value {
    serde_json::json!({
        "container": j.target.name,
        "region_file": j.target.region.display().to_string(),
        "limits_file": j.target.limits.as_ref().map(|p| p.display().to_string()),
        "limits_error": j.limits_error.as_ref().map(ToString::to_string),
        "verdict": j.verdict,
        "region": j.region.as_ref().ok(),
        "error": j.region.as_ref().err(),
    })
}

/// `hami-limits region`: 0 when no container has a problem verdict, 1 when one has (`uncapped`,
/// `mismatch`, `stale`, `unreadable`), 2 when PATH cannot be read.
pub fn run(args: &RegionArgs) -> u8 {
    let targets = match targets(args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("hami-limits: {e}");
            return EXIT_UNREADABLE;
        }
    };
    let judged: Vec<Judged> = targets.into_iter().map(|t| judge_target(t, args)).collect();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if args.json {
        let containers: Vec<serde_json::Value> = judged.iter().map(json_of).collect();
        writeln!(out, "{}", serde_json::json!({ "containers": containers }))
    } else {
        judged.iter().try_for_each(|j| write_human(&mut out, j))
    };
    if written.and_then(|()| out.flush()).is_err() {
        return EXIT_UNREADABLE;
    }
    if !args.json {
        let mut counts = std::collections::BTreeMap::new();
        for j in &judged {
            *counts.entry(j.verdict.verdict.as_str()).or_insert(0) += 1;
        }
        let summary: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
        eprintln!(
            "hami-limits: {} container(s): {}",
            judged.len(),
            if summary.is_empty() {
                "none".to_owned()
            } else {
                summary.join(", ")
            }
        );
    }
    if judged.iter().any(|j| j.verdict.verdict.is_problem()) {
        EXIT_PROBLEM
    } else {
        EXIT_CLEAN
    }
}

/// `hami-limits region --layout`: the offsets the reader assumes, as JSON, to compare with
/// `offsetof()` against HAMi-core's header on a GPU machine.
pub fn layout_json() -> serde_json::Value {
    serde_json::json!({
        "magic_flag": MAGIC_FLAG,
        "device_count": DEVICE_COUNT,
        "slot_count": SLOT_COUNT,
        "sizeof_sem_t": SEM_SIZE,
        "sizeof_device_memory_t": DEVICE_MEMORY_SIZE,
        "sizeof_device_util_t": DEVICE_UTIL_SIZE,
        "uuid_size": UUID_SIZE,
        "max_file_bytes_read": MAX_REGION_FILE_BYTES + 1,
        "layouts": LAYOUTS,
    })
}
