//! Shared pieces of the benchmark binaries (`bench-app`, `bench-ops`, `bench-agent`):
//! figures are printed, never asserted.
//!
//! A benchmark starts its processes with [`ControllerProcess::start_with_admin`] (a free
//! loopback port for every admin server: no fixed port, so a benchmark can run beside
//! `just demo` or another benchmark), and every wait here stops, with the log, as soon as
//! one of them has exited while nobody stopped it: every process this binary started is
//! its own.
//!
//! [`ControllerProcess::start_with_admin`]: crate::process::ControllerProcess::start_with_admin

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};

use crate::process::check_exits;

/// Fails, with its log, if a process this benchmark started has exited unexpectedly.
pub fn check_processes(what: &str) -> anyhow::Result<()> {
    Ok(check_exits(None, what)?)
}

/// Sleeps `duration` (a settling or measuring window), failing at once if a process this
/// benchmark started exits meanwhile.
pub async fn pause(what: &str, duration: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + duration;
    loop {
        check_processes(what)?;
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        tokio::time::sleep(left.min(Duration::from_millis(200))).await;
    }
}

/// Resident set size of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
}

/// CPU time (user + system) `pid` has used so far, in seconds (`/proc/<pid>/stat`, whose
/// clock ticks are USER_HZ, 100 per second on Linux).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after it are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// `n 120, p50 210 ms, p90 260 ms, p99 480 ms, max 520 ms` for an ascending list of
/// milliseconds.
pub fn describe_ms(sorted: &[f64]) -> String {
    format!(
        "n {}, p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        sorted.len(),
        percentile(sorted, 0.5),
        percentile(sorted, 0.9),
        percentile(sorted, 0.99),
        sorted.last().copied().unwrap_or(f64::NAN)
    )
}

/// The `p` percentile (0..=1) of an ascending list (NaN when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// The cumulative buckets (`le`, count) of the Prometheus histogram `metric` over the series
/// whose line holds every one of `labels`, summed per bound, in increasing `le` (`+Inf` last).
pub fn histogram_buckets(text: &str, metric: &str, labels: &[&str]) -> Vec<(f64, f64)> {
    let prefix = format!("{metric}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        if !labels.iter().all(|want| line.contains(want)) {
            continue;
        }
        let le = line
            .split("le=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|bound| {
                if bound == "+Inf" {
                    Some(f64::INFINITY)
                } else {
                    bound.parse().ok()
                }
            });
        let count = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(le), Some(count)) = (le, count) {
            match buckets.iter_mut().find(|(bound, _)| *bound == le) {
                Some((_, total)) => *total += count,
                None => buckets.push((le, count)),
            }
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// `after - before`, bound by bound (a histogram over the time between two scrapes).
pub fn histogram_delta(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(le, count)| {
            let earlier = before.iter().find(|(b, _)| b == le).map_or(0.0, |(_, c)| *c);
            (*le, count - earlier)
        })
        .collect()
}

/// The `q` quantile of cumulative buckets, interpolated linearly within its bucket as
/// Prometheus' `histogram_quantile` does (the highest finite bound when it falls in `+Inf`;
/// NaN when empty).
pub fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return f64::NAN;
    };
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let mut previous = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return previous.0;
            }
            let within = count - previous.1;
            let fraction = if within > 0.0 {
                (rank - previous.1) / within
            } else {
                1.0
            };
            return previous.0 + (le - previous.0) * fraction;
        }
        previous = (le, count);
    }
    previous.0
}

/// Deletes (and waits for) then creates the namespace `name`. The deletion may need a
/// controller this benchmark started (finalizers): it fails at once if that one exits.
pub async fn recreate_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(name).await?.is_some() {
        api.delete(name, &DeleteParams::default()).await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        while api.get_opt(name).await?.is_some() {
            check_processes(&format!("namespace {name} to be deleted"))?;
            anyhow::ensure!(Instant::now() < deadline, "namespace {name} not deleted after 10 min");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    api.create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// Polls `done` every 200 ms until it holds; returns how long that took. Fails at once if
/// a process this benchmark started exits meanwhile.
pub async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        if done().await? {
            return Ok(start.elapsed());
        }
        check_processes(what)?;
        anyhow::ensure!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The pid of a component of the local cluster (`etcd`, `kube-apiserver`, `helm-controller`,
/// …) from `<cluster dir>/pids/<name>.pid` ([`crate::cluster_dir`]: `$VWS_CLUSTER_DIR`, else the
/// default cluster's), which `hack/cluster.sh` writes. None when the cluster is not running.
pub fn cluster_component_pid(name: &str) -> Option<u32> {
    std::fs::read_to_string(crate::cluster_dir().join("pids").join(format!("{name}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The 1-, 5- and 15-minute load averages, as `/proc/loadavg` gives them (`"1.02 0.87 0.55"`).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Waits until each of the cluster components `names` uses at most `max_share` of one core
/// over a 2 s window (e.g. Flux's controllers done with uninstalls and fetches), at most
/// `bound`. Returns the wait, or None when some component was still busy at `bound` (or
/// its pid is unknown: then it just waits one window).
pub async fn wait_components_idle(names: &[&str], max_share: f64, bound: Duration) -> anyhow::Result<Option<Duration>> {
    const WINDOW: Duration = Duration::from_secs(2);
    let start = Instant::now();
    let pids: Vec<u32> = names.iter().filter_map(|n| cluster_component_pid(n)).collect();
    if pids.len() < names.len() {
        pause("cluster components to idle", WINDOW).await?;
        return Ok(None);
    }
    loop {
        let before: Vec<Option<f64>> = pids.iter().map(|p| cpu_seconds(*p)).collect();
        pause("cluster components to idle", WINDOW).await?;
        let busy = pids
            .iter()
            .zip(&before)
            .any(|(pid, before)| match (before, cpu_seconds(*pid)) {
                (Some(b), Some(a)) => (a - b) / WINDOW.as_secs_f64() > max_share,
                _ => false,
            });
        if !busy {
            return Ok(Some(start.elapsed()));
        }
        if start.elapsed() >= bound {
            return Ok(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_interpolate_within_the_bucket() {
        let text = "\
x_bucket{type=\"Runbook\",le=\"0.01\"} 50
x_bucket{type=\"Runbook\",le=\"0.1\"} 90
x_bucket{type=\"Runbook\",le=\"+Inf\"} 100
x_bucket{type=\"Backup\",le=\"0.01\"} 7
x_sum{type=\"Runbook\"} 3
";
        let buckets = histogram_buckets(text, "x", &["type=\"Runbook\""]);
        assert_eq!(buckets, vec![(0.01, 50.0), (0.1, 90.0), (f64::INFINITY, 100.0)]);
        assert!((histogram_quantile(&buckets, 0.5) - 0.01).abs() < 1e-9);
        assert!((histogram_quantile(&buckets, 0.7) - 0.055).abs() < 1e-9);
        assert!(
            (histogram_quantile(&buckets, 0.99) - 0.1).abs() < 1e-9,
            "in +Inf: the highest bound"
        );
        let before = vec![(0.01, 40.0), (0.1, 40.0), (f64::INFINITY, 40.0)];
        assert_eq!(
            histogram_delta(&buckets, &before),
            vec![(0.01, 10.0), (0.1, 50.0), (f64::INFINITY, 60.0)]
        );
        assert!(histogram_quantile(&[], 0.5).is_nan());
    }
}
