//! The Markdown table of `ray_dashboard.sh`: Ray's own dashboard and
//! ray-dashd hosting the same modules on the same head, each number as a
//! median over rounds, with ray-dashd / Ray.
//!
//! Input: one JSON object a line, as the script writes them:
//! `{"kind": "http"|"startup"|"mem_ready"|"mem_loaded"|"stop",
//!   "system": "ray"|"dashd", "path": P, "conns": N, "round": R, "result": {...}}`
//! where `result` is a subcommand's output (`path` and `conns` for `http` only).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use serde_json::Value;

/// Arguments of `ray-report`.
#[derive(Debug, Args)]
pub(crate) struct RayReportArgs {
    /// The tagged results (JSON lines).
    #[arg(long)]
    input: PathBuf,
}

/// The two columns, in order.
const SYSTEMS: [&str; 2] = ["ray", "dashd"];

struct Results(Vec<Value>);

impl Results {
    fn matching<'a>(
        &'a self,
        kind: &'a str,
        system: &'a str,
        path: Option<&'a str>,
        conns: Option<u64>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.0.iter().filter(move |v| {
            v["kind"] == kind
                && v["system"] == system
                && path.is_none_or(|p| v["path"] == p)
                && conns.is_none_or(|c| v["conns"].as_u64() == Some(c))
        })
    }

    /// Every round's value of `field` (a `/`-separated JSON pointer below
    /// `result`), in round order.
    fn values(
        &self,
        kind: &str,
        system: &str,
        path: Option<&str>,
        conns: Option<u64>,
        field: &str,
    ) -> Vec<f64> {
        self.matching(kind, system, path, conns)
            .filter_map(|v| v["result"].pointer(&format!("/{field}"))?.as_f64())
            .collect()
    }

    /// The median of [`Results::values`].
    fn median(
        &self,
        kind: &str,
        system: &str,
        path: Option<&str>,
        conns: Option<u64>,
        field: &str,
    ) -> Option<f64> {
        median(self.values(kind, system, path, conns, field))
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2]),
        n => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// How a number is shown.
#[derive(Clone, Copy)]
enum Unit {
    /// Requests per second, thousands separated.
    Rate,
    /// Microseconds shown as milliseconds.
    UsAsMs,
    /// Microseconds.
    Us,
    /// KiB shown as MiB.
    KibAsMib,
    /// Milliseconds shown as seconds.
    MsAsS,
    /// A count.
    Count,
}

fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 {
        out.insert(0, '-');
    }
    out
}

fn show(v: Option<f64>, unit: Unit) -> String {
    let Some(v) = v else {
        return "—".to_owned();
    };
    match unit {
        Unit::Rate => thousands(v),
        Unit::UsAsMs => format!("{:.2} ms", v / 1000.0),
        Unit::Us => format!("{v:.0} µs"),
        Unit::KibAsMib => format!("{:.1} MiB", v / 1024.0),
        Unit::MsAsS => format!("{:.2} s", v / 1000.0),
        Unit::Count => format!("{v:.0}"),
    }
}

fn ratio(ours: Option<f64>, ray: Option<f64>) -> String {
    match (ours, ray) {
        (Some(o), Some(r)) if r > 0.0 => format!("{:.2}×", o / r),
        _ => "—".to_owned(),
    }
}

/// One table row: a metric with both systems' medians.
struct Row {
    metric: String,
    values: [Option<f64>; 2],
    unit: Unit,
}

/// Renders the table and the notes below it as Markdown.
pub(crate) fn render(args: &RayReportArgs) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("read {}", args.input.display()))?;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", args.input.display(), i + 1))?;
        lines.push(value);
    }
    let r = Results(lines);

    // Paths in the order first measured; connection counts ascending.
    let mut paths: Vec<&str> = vec![];
    let mut conns: Vec<u64> = vec![];
    for v in r.0.iter().filter(|v| v["kind"] == "http") {
        if let Some(p) = v["path"].as_str() {
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
        if let Some(c) = v["conns"].as_u64() {
            if !conns.contains(&c) {
                conns.push(c);
            }
        }
    }
    conns.sort_unstable();

    let both = |kind: &str, path: Option<&str>, conns: Option<u64>, field: &str| {
        SYSTEMS.map(|s| r.median(kind, s, path, conns, field))
    };
    let mut rows = vec![];
    for &path in &paths {
        for &c in &conns {
            let at = format!("`GET {path}`, {c} conn");
            rows.push(Row {
                metric: format!("{at}: req/s"),
                values: both("http", Some(path), Some(c), "rps"),
                unit: Unit::Rate,
            });
            rows.push(Row {
                metric: format!("{at}: p50 latency"),
                values: both("http", Some(path), Some(c), "p50_us"),
                unit: Unit::UsAsMs,
            });
            rows.push(Row {
                metric: format!("{at}: p99 latency"),
                values: both("http", Some(path), Some(c), "p99_us"),
                unit: Unit::UsAsMs,
            });
            rows.push(Row {
                metric: format!("{at}: parent CPU per request"),
                values: both("http", Some(path), Some(c), "cpu_us_per_req"),
                unit: Unit::Us,
            });
        }
    }
    rows.push(Row {
        metric: "start-up: launch → all modules ready and every route above 200".to_owned(),
        values: both("startup", None, None, "ready_ms"),
        unit: Unit::MsAsS,
    });
    for (kind, when) in [
        ("mem_ready", "just after start-up"),
        ("mem_loaded", "after the load"),
    ] {
        rows.push(Row {
            metric: format!("parent PSS, {when}"),
            values: both(kind, None, None, "parent_pss_kib"),
            unit: Unit::KibAsMib,
        });
        rows.push(Row {
            metric: format!("total PSS (parent and every process below it), {when}"),
            values: both(kind, None, None, "total_pss_kib"),
            unit: Unit::KibAsMib,
        });
    }
    rows.push(Row {
        metric: "processes (parent and below), after the load".to_owned(),
        values: both("mem_loaded", None, None, "processes"),
        unit: Unit::Count,
    });

    let mut out = String::new();
    out.push_str("| metric | Ray's dashboard | ray-dashd | ray-dashd / Ray |\n");
    out.push_str("|---|---:|---:|---:|\n");
    for row in &rows {
        let [ray, ours] = row.values;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            row.metric,
            show(ray, row.unit),
            show(ours, row.unit),
            ratio(ours, ray)
        );
    }

    // Every round's start-up and memory, to judge the spread.
    out.push_str("\nPer round (in run order):\n");
    for (system, name) in SYSTEMS.iter().zip(["Ray's dashboard", "ray-dashd"]) {
        let list = |kind: &str, field: &str, unit: Unit| {
            r.values(kind, system, None, None, field)
                .into_iter()
                .map(|v| show(Some(v), unit))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "- {name}: start-up {}; total PSS after the load {}; parent PSS after the load {}",
            list("startup", "ready_ms", Unit::MsAsS),
            list("mem_loaded", "total_pss_kib", Unit::KibAsMib),
            list("mem_loaded", "parent_pss_kib", Unit::KibAsMib),
        );
    }
    // ray-dashd's routes answer as soon as their module is up; the rest of
    // its modules may still be starting.
    let routes_first = r.median("startup", "dashd", None, None, "routes_ms");
    let modules = r.median("startup", "dashd", None, None, "modules_ms");
    let first_started = r.median("startup", "dashd", None, None, "first_module_started_ms");
    if let (Some(routes), Some(modules)) = (routes_first, modules) {
        let _ = writeln!(
            out,
            "- ray-dashd start-up, medians: first module process started after {} \
             (with the fork launch: Ray's zygote, which reports the route table), \
             every route above 200 after {}, \
             all modules healthy after {}",
            show(first_started, Unit::MsAsS),
            show(Some(routes), Unit::MsAsS),
            show(Some(modules), Unit::MsAsS)
        );
    }
    let restarts: f64 = r
        .values("startup", "dashd", None, None, "module_restarts")
        .iter()
        .sum();
    if restarts > 0.0 {
        let _ = writeln!(
            out,
            "- ray-dashd restarted a module {restarts:.0} time(s) during start-up, over all rounds"
        );
    }

    let problems: Vec<String> =
        r.0.iter()
            .filter(|v| v["result"]["errors"].as_u64().unwrap_or(0) > 0)
            .map(|v| {
                format!(
                    "- round {} {} `GET {}` ({} conn): {} errors; first: {}",
                    v["round"],
                    v["system"].as_str().unwrap_or("?"),
                    v["path"].as_str().unwrap_or("?"),
                    v["conns"],
                    v["result"]["errors"],
                    v["result"]["first_error"].as_str().unwrap_or("?"),
                )
            })
            .collect();
    if !problems.is_empty() {
        out.push_str("\nErrors during the run:\n");
        out.push_str(&problems.join("\n"));
        out.push('\n');
    }
    Ok(out.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1234.0), "1,234");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn renders_both_columns_and_the_ratio() {
        let dir = std::env::temp_dir().join(format!("ray-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let input = dir.join("r.jsonl");
        let lines = [
            r#"{"kind":"http","system":"ray","path":"/api/version","conns":1,"round":1,"result":{"rps":1000,"p50_us":900,"p99_us":2000,"cpu_us_per_req":500,"errors":0}}"#,
            r#"{"kind":"http","system":"dashd","path":"/api/version","conns":1,"round":1,"result":{"rps":2500,"p50_us":400,"p99_us":800,"cpu_us_per_req":20,"errors":2,"first_error":"status 502"}}"#,
            r#"{"kind":"startup","system":"ray","round":1,"result":{"ready_ms":5000}}"#,
            r#"{"kind":"startup","system":"dashd","round":1,"result":{"ready_ms":4000,"routes_ms":3000,"modules_ms":4000}}"#,
            r#"{"kind":"mem_loaded","system":"ray","round":1,"result":{"parent_pss_kib":102400,"total_pss_kib":307200,"processes":11}}"#,
            r#"{"kind":"mem_loaded","system":"dashd","round":1,"result":{"parent_pss_kib":10240,"total_pss_kib":204800,"processes":10}}"#,
        ];
        std::fs::write(&input, lines.join("\n")).expect("write");
        let table = render(&RayReportArgs {
            input: input.clone(),
        })
        .expect("render");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            table.contains("| `GET /api/version`, 1 conn: req/s | 1,000 | 2,500 | 2.50× |"),
            "{table}"
        );
        assert!(table.contains("| 500 µs | 20 µs | 0.04× |"), "{table}");
        assert!(table.contains("| 5.00 s | 4.00 s | 0.80× |"), "{table}");
        assert!(
            table.contains("| 300.0 MiB | 200.0 MiB | 0.67× |"),
            "{table}"
        );
        assert!(table.contains("2 errors; first: status 502"), "{table}");
    }
}
