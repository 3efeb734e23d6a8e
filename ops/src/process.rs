//! `process_*` metrics, the names every Prometheus client library exports (Go's
//! `collectors.NewProcessCollector`): CPU time, memory, file descriptors and start time, read from
//! `/proc/self` at each scrape. The parsing is pure ([`ProcessStats::parse`]) and tested on
//! recorded `/proc` text; a read that fails leaves the metric out rather than exporting a wrong 0.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Linux's `USER_HZ`: the unit of the CPU times in `/proc/<pid>/stat`. It is 100 on every
/// architecture Linux supports (the kernel converts to it for user space, whatever `HZ` is).
const USER_HZ: f64 = 100.0;

/// What one scrape reads about the process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Virtual memory size, bytes.
    pub virtual_memory_bytes: u64,
    /// Resident set size, bytes.
    pub resident_memory_bytes: u64,
    /// Start time since the Unix epoch, seconds.
    pub start_time_seconds: f64,
    /// Threads.
    pub threads: u64,
}

impl ProcessStats {
    /// Parses `/proc/self/stat` (`stat`: CPU times, start time), `/proc/self/status` (`status`:
    /// `VmRSS`, `VmSize` in kB, `Threads`) and the boot time from `/proc/stat` (its `btime`
    /// line). `None` when the text is not what Linux writes.
    #[must_use]
    pub fn parse(stat: &str, status: &str, proc_stat: &str) -> Option<Self> {
        // `pid (comm) state ...`: comm may hold spaces and parentheses; the fields follow the
        // last `)`. Counting from `state` as field 3 (proc(5)).
        let after = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = after.split_ascii_whitespace().collect();
        let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
        let utime = field(14)?;
        let stime = field(15)?;
        let start_ticks = field(22)?;
        let status_value = |key: &str| -> Option<u64> {
            let line = status.lines().find_map(|l| l.strip_prefix(key))?;
            line.trim_start_matches(':')
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        let boot_time: u64 = proc_stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(Self {
            cpu_seconds: (utime + stime) as f64 / USER_HZ,
            virtual_memory_bytes: status_value("VmSize")?.saturating_mul(1024),
            resident_memory_bytes: status_value("VmRSS")?.saturating_mul(1024),
            start_time_seconds: boot_time as f64 + start_ticks as f64 / USER_HZ,
            threads: status_value("Threads")?,
        })
    }
}

/// The soft limit on open files from `/proc/self/limits` (`Max open files  <soft>  <hard>  files`).
#[must_use]
pub fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    match soft {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// The collector: reads `/proc/self` when encoded.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessCollector;

fn gauge<T: prometheus_client::encoding::EncodeGaugeValue + Copy + std::fmt::Debug>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: T,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<T>: EncodeMetric,
{
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(metric)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        if let Some(s) = ProcessStats::parse(&stat, &status, &proc_stat) {
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(s.cpu_seconds).encode(metric)?;
            gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_memory_bytes as i64,
            )?;
            gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_memory_bytes as i64,
            )?;
            gauge(
                &mut encoder,
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                s.start_time_seconds,
            )?;
            gauge(
                &mut encoder,
                "process_threads",
                "Number of OS threads in the process",
                s.threads as i64,
            )?;
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle itself is one of the entries.
            let open = dir.count().saturating_sub(1);
            gauge(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                i64::try_from(open).unwrap_or(i64::MAX),
            )?;
        }
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        if let Some(max) = parse_max_fds(&limits) {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                i64::try_from(max).unwrap_or(i64::MAX),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    // Recorded on Linux 6.1 (a comm with a space and a parenthesis, as a process may set).
    const STAT: &str = "4242 (hami (web) x) S 1 4242 4242 0 -1 4194560 1375 0 0 0 250 125 0 0 20 0 7 0 123456 58720256 3072 18446744073709551615 1 1 0 0 0 0 0 4096 17475 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
    const PROC_STAT: &str = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1764550000\nprocesses 7\n";

    const STATUS: &str = "Name:\thami-webhook\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t   61004 kB\nVmSize:\t   57344 kB\nVmHWM:\t   12800 kB\nVmRSS:\t   12288 kB\nThreads:\t7\n";

    #[test]
    fn stat_fields_after_the_last_parenthesis() {
        let s = ProcessStats::parse(STAT, STATUS, PROC_STAT).unwrap();
        assert_eq!(s.cpu_seconds, 3.75); // (250 + 125) ticks / 100
        assert_eq!(s.threads, 7);
        assert_eq!(s.virtual_memory_bytes, 57_344 * 1024);
        assert_eq!(s.resident_memory_bytes, 12_288 * 1024);
        assert_eq!(s.start_time_seconds, 1_764_550_000.0 + 1234.56);
    }

    #[test]
    fn what_is_not_proc_text_gives_nothing() {
        assert_eq!(ProcessStats::parse("", STATUS, PROC_STAT), None);
        assert_eq!(ProcessStats::parse("1 (x) S 1 2", STATUS, PROC_STAT), None);
        assert_eq!(ProcessStats::parse(STAT, STATUS, "cpu 1\n"), None);
        assert_eq!(ProcessStats::parse(STAT, "Name:\tx\n", PROC_STAT), None);
    }

    #[test]
    fn the_live_process_reads() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let proc_stat = std::fs::read_to_string("/proc/stat").unwrap();
        let s = ProcessStats::parse(&stat, &status, &proc_stat).unwrap();
        assert!(s.resident_memory_bytes > 0 && s.threads >= 1, "{s:?}");
        assert!(s.start_time_seconds > 1_600_000_000.0, "{s:?}");
    }

    #[test]
    fn max_open_files_is_the_soft_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax cpu time              unlimited            unlimited            seconds\nMax open files            1048576              1048576              files\n";
        assert_eq!(parse_max_fds(limits), Some(1_048_576));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            Some(u64::MAX)
        );
        assert_eq!(parse_max_fds("nothing"), None);
    }
}
