//! The Markdown table of one run: each measurement of ray-dashd, nginx and
//! the bare relay (`tcp-relay`, the floor of any proxy hop) as a ratio to
//! the backend measured directly, with the targets.
//!
//! Input: one JSON object a line, as `run.sh` writes them:
//! `{"kind": "http"|"stream"|"ws"|"rss"|"kill", "target": "direct"|"dashd"|"nginx"|"relay",
//!   "conns": N, "round": R, "result": {...}}` where `result` is a subcommand's
//! output. A measurement repeated over rounds is shown as its median; where
//! nginx ran, a second table gives ray-dashd's ratio to it round by round.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use serde_json::Value;

use crate::ray_report::median;

/// Arguments of `report`.
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// The tagged results (JSON lines).
    #[arg(long)]
    input: PathBuf,
}

/// The columns, in order.
const TARGETS: [&str; 4] = ["direct", "dashd", "nginx", "relay"];

struct Results(Vec<Value>);

impl Results {
    /// Every line of `kind` from `target` (at `conns`, when given), one
    /// per round, in the order they were written.
    fn lines<'a, 'k>(
        &'a self,
        kind: &'k str,
        target: &'k str,
        conns: Option<u64>,
    ) -> impl DoubleEndedIterator<Item = &'a Value> + use<'a, 'k> {
        self.0.iter().filter(move |v| {
            v["kind"] == kind
                && v["target"] == target
                && conns.is_none_or(|c| v["conns"].as_u64() == Some(c))
        })
    }

    /// The results of those lines.
    fn matching<'a, 'k>(
        &'a self,
        kind: &'k str,
        target: &'k str,
        conns: Option<u64>,
    ) -> impl DoubleEndedIterator<Item = &'a Value> + use<'a, 'k> {
        self.lines(kind, target, conns).map(|v| &v["result"])
    }

    fn find(&self, kind: &str, target: &str, conns: Option<u64>) -> Option<&Value> {
        self.matching(kind, target, conns).next_back()
    }

    /// `field` of every matching result.
    fn values(&self, kind: &str, target: &str, conns: Option<u64>, field: &str) -> Vec<f64> {
        self.matching(kind, target, conns)
            .filter_map(|result| result.get(field)?.as_f64())
            .collect()
    }

    /// `field` of every matching result, by the round it was measured in.
    fn by_round(
        &self,
        kind: &str,
        target: &str,
        conns: Option<u64>,
        field: &str,
    ) -> BTreeMap<u64, f64> {
        self.lines(kind, target, conns)
            .filter_map(|v| Some((v["round"].as_u64()?, v["result"].get(field)?.as_f64()?)))
            .collect()
    }

    /// ray-dashd's value over nginx's, round by round, for the rounds that
    /// measured both.
    fn against_nginx(&self, kind: &str, conns: Option<u64>, field: &str) -> Vec<f64> {
        let nginx = self.by_round(kind, "nginx", conns, field);
        self.by_round(kind, "dashd", conns, field)
            .into_iter()
            .filter_map(|(round, dashd)| ratio(Some(dashd), nginx.get(&round).copied()))
            .collect()
    }

    /// The median of `field` over every matching result (one per round).
    fn number(&self, kind: &str, target: &str, conns: Option<u64>, field: &str) -> Option<f64> {
        median(self.values(kind, target, conns, field))
    }

    /// How far apart the rounds' values of `field` lie: (largest −
    /// smallest) / median, with the number of rounds; `None` with fewer
    /// than two.
    fn spread(
        &self,
        kind: &str,
        target: &str,
        conns: Option<u64>,
        field: &str,
    ) -> Option<(f64, usize)> {
        let values = self.values(kind, target, conns, field);
        if values.len() < 2 {
            return None;
        }
        let (low, high) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        let rounds = values.len();
        let middle = median(values)?;
        (middle > 0.0).then(|| ((high - low) / middle, rounds))
    }
}

/// How a row is judged against its target.
#[derive(Clone, Copy)]
enum Goal {
    None,
    /// ray-dashd/direct at least this.
    RatioAtLeast(f64),
    /// ray-dashd/direct at most this.
    RatioAtMost(f64),
    /// ray-dashd's value at most this.
    ValueAtMost(f64),
    /// ray-dashd's value at least nginx's.
    AtLeastNginx,
}

struct Row<'a> {
    metric: String,
    values: [Option<f64>; 4],
    /// Whether the direct column has a meaning (it has no proxy CPU or RSS).
    ratios: bool,
    decimals: usize,
    goal: Goal,
    goal_text: &'a str,
}

fn fmt_value(v: Option<f64>, decimals: usize, missing: &str) -> String {
    v.map_or_else(|| missing.to_owned(), |v| format!("{v:.decimals$}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn verdict(row: &Row<'_>) -> String {
    let [direct, dashd, nginx, _] = row.values;
    let met = match row.goal {
        Goal::None => return String::new(),
        Goal::RatioAtLeast(min) => ratio(dashd, direct).map(|r| r >= min),
        Goal::RatioAtMost(max) => ratio(dashd, direct).map(|r| r <= max),
        Goal::ValueAtMost(max) => dashd.map(|v| v <= max),
        Goal::AtLeastNginx => match (dashd, nginx) {
            (Some(d), Some(n)) => Some(d >= n),
            _ => None,
        },
    };
    let mark = match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    };
    format!("{}: {mark}", row.goal_text)
}

/// Renders the table (and notes on errors) as Markdown.
pub(crate) fn render(args: &ReportArgs) -> anyhow::Result<String> {
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
    let has_nginx = r.0.iter().any(|v| v["target"] == "nginx");
    let has_relay = r.0.iter().any(|v| v["target"] == "relay");
    let mut http_conns: Vec<u64> =
        r.0.iter()
            .filter(|v| v["kind"] == "http")
            .filter_map(|v| v["conns"].as_u64())
            .collect();
    http_conns.sort_unstable();
    http_conns.dedup();
    let mut ws_conns: Vec<u64> =
        r.0.iter()
            .filter(|v| v["kind"] == "ws")
            .filter_map(|v| v["conns"].as_u64())
            .collect();
    ws_conns.sort_unstable();
    ws_conns.dedup();

    let per_target = |kind: &str, conns: Option<u64>, field: &str| {
        TARGETS.map(|t| r.number(kind, t, conns, field))
    };
    let mut rows = Vec::new();
    for &c in &http_conns {
        let big = c >= 16;
        rows.push(Row {
            metric: format!("small GET req/s, {c} conn"),
            values: per_target("http", Some(c), "rps"),
            ratios: true,
            decimals: 0,
            goal: if big {
                Goal::RatioAtLeast(0.9)
            } else {
                Goal::None
            },
            goal_text: "≥ 0.9× direct",
        });
    }
    for &c in &http_conns {
        rows.push(Row {
            metric: format!("small GET p99 µs, {c} conn"),
            values: per_target("http", Some(c), "p99_us"),
            ratios: true,
            decimals: 0,
            goal: if c >= 64 {
                Goal::RatioAtMost(1.2)
            } else {
                Goal::None
            },
            goal_text: "≤ 1.2× direct",
        });
    }
    for &c in &http_conns {
        let mut values = per_target("http", Some(c), "cpu_us_per_req");
        values[0] = None;
        rows.push(Row {
            metric: format!("proxy CPU µs/request, {c} conn"),
            values,
            ratios: false,
            decimals: 1,
            goal: Goal::ValueAtMost(40.0),
            goal_text: "≤ 40 µs",
        });
    }
    if let Some(&c) = http_conns.last() {
        rows.push(Row {
            metric: format!("backend CPU µs/request, {c} conn"),
            values: per_target("http", Some(c), "backend_cpu_us_per_req"),
            ratios: true,
            decimals: 1,
            goal: Goal::None,
            goal_text: "",
        });
        rows.push(Row {
            metric: format!("load generator CPU µs/request, {c} conn"),
            values: per_target("http", Some(c), "loadgen_cpu_us_per_req"),
            ratios: true,
            decimals: 1,
            goal: Goal::None,
            goal_text: "",
        });
    }
    rows.push(Row {
        metric: "1 GiB stream MiB/s (best of runs)".to_owned(),
        values: per_target("stream", None, "mib_per_s"),
        ratios: true,
        decimals: 0,
        goal: Goal::RatioAtLeast(0.7),
        goal_text: "≥ 0.7× direct",
    });
    for &c in &ws_conns {
        rows.push(Row {
            metric: format!("ws echo msgs/s, {c} conn"),
            values: per_target("ws", Some(c), "msgs_per_s"),
            ratios: true,
            decimals: 0,
            goal: Goal::AtLeastNginx,
            goal_text: "≥ nginx",
        });
    }
    let mut stream_cpu = per_target("stream", None, "cpu_ms_per_gib");
    stream_cpu[0] = None;
    rows.push(Row {
        metric: "proxy CPU ms per GiB streamed".to_owned(),
        values: stream_cpu,
        ratios: false,
        decimals: 0,
        goal: Goal::None,
        goal_text: "",
    });
    for &c in &ws_conns {
        let mut values = per_target("ws", Some(c), "cpu_us_per_msg");
        values[0] = None;
        rows.push(Row {
            metric: format!("proxy CPU µs per ws echo, {c} conn"),
            values,
            ratios: false,
            decimals: 1,
            goal: Goal::None,
            goal_text: "",
        });
    }
    for &c in &ws_conns {
        rows.push(Row {
            metric: format!("ws echo p99 µs, {c} conn"),
            values: per_target("ws", Some(c), "p99_us"),
            ratios: true,
            decimals: 0,
            goal: Goal::None,
            goal_text: "",
        });
    }
    // The kernel's VmHWM is kept lazily (it can read a little lower than an
    // earlier VmRSS-based reading), so the peak is the largest of all samples.
    let largest = |field: &str| {
        let mut values = TARGETS.map(|t| {
            r.0.iter()
                .filter(|v| {
                    v["target"] == t && v["kind"].as_str().is_some_and(|k| k.starts_with("rss"))
                })
                .filter_map(|v| v["result"][field].as_f64())
                .reduce(f64::max)
                .map(|k| k / 1024.0)
        });
        values[0] = None;
        values
    };
    let rss = largest("vmhwm_kib");
    rows.push(Row {
        metric: "proxy peak RSS MiB (VmHWM)".to_owned(),
        values: rss,
        ratios: false,
        decimals: 1,
        goal: Goal::ValueAtMost(13.0),
        goal_text: "≤ 13 MiB",
    });
    rows.push(Row {
        metric: "proxy private RSS MiB (RssAnon, largest reading)".to_owned(),
        values: largest("rssanon_kib"),
        ratios: false,
        decimals: 2,
        goal: Goal::None,
        goal_text: "",
    });
    let mut kill = per_target("kill", None, "ms_to_200");
    kill[0] = None;
    kill[2] = None;
    kill[3] = None;
    rows.push(Row {
        metric: "SIGKILL module → first 200, ms".to_owned(),
        values: kill,
        ratios: false,
        decimals: 0,
        goal: Goal::None,
        goal_text: "",
    });

    let mut out = String::new();
    out.push_str(
        "| metric | direct | ray-dashd | ray-dashd/direct | nginx | nginx/direct | bare relay | relay/direct | target (ray-dashd) |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for row in &rows {
        let [direct, dashd, nginx, relay] = row.values;
        let nginx_missing = if has_nginx { "—" } else { "n/a" };
        let relay_missing = if has_relay { "—" } else { "n/a" };
        let cells = [
            row.metric.clone(),
            fmt_value(direct, row.decimals, "—"),
            fmt_value(dashd, row.decimals, "—"),
            if row.ratios {
                fmt_ratio(ratio(dashd, direct))
            } else {
                "—".to_owned()
            },
            fmt_value(nginx, row.decimals, nginx_missing),
            if row.ratios {
                fmt_ratio(ratio(nginx, direct))
            } else {
                "—".to_owned()
            },
            fmt_value(relay, row.decimals, relay_missing),
            if row.ratios {
                fmt_ratio(ratio(relay, direct))
            } else {
                "—".to_owned()
            },
            verdict(row),
        ];
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let problems: Vec<String> =
        r.0.iter()
            .filter(|v| v["result"]["errors"].as_u64().unwrap_or(0) > 0)
            .map(|v| {
                format!(
                    "- {} {} ({} conn): {} errors; first: {}",
                    v["kind"].as_str().unwrap_or("?"),
                    v["target"].as_str().unwrap_or("?"),
                    v["conns"],
                    v["result"]["errors"],
                    v["result"]["first_error"].as_str().unwrap_or("?"),
                )
            })
            .collect();
    let mut noise = Vec::new();
    let mut rounds = 0;
    for (kind, conns, field, what) in http_conns
        .iter()
        .map(|&c| ("http", c, "rps", "req/s"))
        .chain(
            ws_conns
                .iter()
                .map(|&c| ("ws", c, "msgs_per_s", "ws echoes/s")),
        )
    {
        if let Some((spread, n)) = r.spread(kind, "direct", Some(conns), field) {
            rounds = rounds.max(n);
            noise.push(format!("{what} {conns} conn {:.0} %", spread * 100.0));
        }
    }
    if !noise.is_empty() {
        let _ = writeln!(
            out,
            "\nNoise: the direct column's own spread over its {rounds} rounds ((largest − smallest) / median): {}. \
             A ratio between two columns that differs from 1 by less than this can be the machine, not the proxy.",
            noise.join(", ")
        );
    }
    if has_nginx {
        out.push_str(&against_nginx(&r, &http_conns, &ws_conns));
    }
    if !problems.is_empty() {
        out.push_str("\nErrors during the run:\n");
        out.push_str(&problems.join("\n"));
        out.push('\n');
    }
    let phases = [
        ("rss_start", "at start"),
        ("rss_http", "after the HTTP points"),
        ("rss_stream", "after the streams"),
        ("rss", "at the end"),
    ];
    let peaks: Vec<String> = phases
        .iter()
        .filter_map(|(kind, when)| {
            let kib = |field| r.number(kind, "dashd", None, field).map(|k| k / 1024.0);
            Some(format!(
                "{:.1} MiB {when} (RssAnon {:.2}, RssFile {:.1})",
                kib("vmhwm_kib")?,
                kib("rssanon_kib").unwrap_or(f64::NAN),
                kib("rssfile_kib").unwrap_or(f64::NAN),
            ))
        })
        .collect();
    if !peaks.is_empty() {
        let _ = writeln!(out, "\nray-dashd VmHWM: {}", peaks.join(", "));
    }
    if let Some(k) = r.find("kill", "dashd", None) {
        let _ = writeln!(
            out,
            "\nRestart: incarnation {} → {}, pid {} → {}, {} polls; non-200 answers seen: {}",
            k["old_incarnation"],
            k["new_incarnation"],
            k["old_pid"],
            k["new_pid"],
            k["polls"],
            k["non_200_seen"],
        );
    }
    Ok(out.trim_end().to_owned())
}

/// One measure of the round-by-round table, at each of `points`
/// (connection counts; `None` for the stream).
struct Measure<'a> {
    what: &'a str,
    kind: &'a str,
    points: &'a [Option<u64>],
    field: &'a str,
    better: Better,
}

/// Which way a measure is better.
#[derive(Clone, Copy)]
enum Better {
    Higher,
    Lower,
}

/// The section that sets ray-dashd beside nginx round by round: each
/// round's ratio of the two, their median, and in how many rounds
/// ray-dashd was at or ahead. Within a round the two columns measure each
/// point one right after the other (`run.sh`), so a drift of the machine's
/// speed over the run weighs less on these ratios than on the ratio of
/// the two medians.
fn against_nginx(r: &Results, http_conns: &[u64], ws_conns: &[u64]) -> String {
    use Better::{Higher, Lower};
    let http: Vec<Option<u64>> = http_conns.iter().copied().map(Some).collect();
    let ws: Vec<Option<u64>> = ws_conns.iter().copied().map(Some).collect();
    let once = [None];
    let measure = |what, kind, points, field, better| Measure {
        what,
        kind,
        points,
        field,
        better,
    };
    let measures = [
        measure("small GET req/s", "http", &http, "rps", Higher),
        measure("small GET p99", "http", &http, "p99_us", Lower),
        measure(
            "proxy CPU per request",
            "http",
            &http,
            "cpu_us_per_req",
            Lower,
        ),
        measure("stream MiB/s", "stream", &once, "mib_per_s", Higher),
        measure(
            "proxy CPU per GiB streamed",
            "stream",
            &once,
            "cpu_ms_per_gib",
            Lower,
        ),
        measure("ws echoes/s", "ws", &ws, "msgs_per_s", Higher),
        measure("proxy CPU per ws echo", "ws", &ws, "cpu_us_per_msg", Lower),
    ];
    let mut out = String::from(
        "\nray-dashd against nginx, round by round (ray-dashd / nginx in each round):\n\n\
         | measure | better | median of the rounds | each round | ray-dashd at or ahead |\n\
         |---|---|---:|---|---:|\n",
    );
    let points = measures.into_iter().flat_map(|m| {
        m.points
            .iter()
            .map(move |&conns| (m.what, m.kind, conns, m.field, m.better))
    });
    for (what, kind, conns, field, better) in points {
        let label = match conns {
            Some(c) => format!("{what}, {c} conn"),
            None => what.to_owned(),
        };
        let ratios = r.against_nginx(kind, conns, field);
        if ratios.is_empty() {
            continue;
        }
        let ahead = ratios
            .iter()
            .filter(|&&x| match better {
                Higher => x >= 1.0,
                Lower => x <= 1.0,
            })
            .count();
        let each: Vec<String> = ratios.iter().map(|x| format!("{x:.2}")).collect();
        let rounds = ratios.len();
        let direction = match better {
            Higher => "higher",
            Lower => "lower",
        };
        let _ = writeln!(
            out,
            "| {label} | {direction} | {} | {} | {ahead} of {rounds} |",
            fmt_ratio(median(ratios)),
            each.join(", "),
        );
    }
    out
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}×"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The noise line gives the direct column's spread over the rounds,
    /// point by point, and is left out with a single round.
    #[test]
    fn the_noise_line_is_the_direct_columns_spread() {
        let line = |target: &str, kind: &str, conns: u64, round: u64, field: &str, v: f64| {
            format!(
                r#"{{"kind":"{kind}","target":"{target}","conns":{conns},"round":{round},"result":{{"{field}":{v}}}}}"#
            )
        };
        let dir = std::env::temp_dir().join(format!("report-noise-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let input = dir.join("latest.jsonl");
        let mut lines = Vec::new();
        for (round, rps, msgs) in [(1, 90.0, 1000.0), (2, 110.0, 1050.0), (3, 100.0, 1000.0)] {
            lines.push(line("direct", "http", 1, round, "rps", rps));
            // ray-dashd's own spread (2 %) must not be the one shown.
            lines.push(line("dashd", "http", 1, round, "rps", 100.0 + round as f64));
            lines.push(line("direct", "ws", 8, round, "msgs_per_s", msgs));
        }
        std::fs::write(&input, lines.join("\n")).expect("write");
        let text = render(&ReportArgs {
            input: input.clone(),
        })
        .expect("render");
        assert!(
            text.contains("over its 3 rounds")
                && text.contains("req/s 1 conn 20 %, ws echoes/s 8 conn 5 %"),
            "{text}"
        );
        std::fs::write(&input, lines[..3].join("\n")).expect("write");
        let text = render(&ReportArgs { input }).expect("render");
        assert!(!text.contains("Noise"), "{text}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The round-by-round section pairs ray-dashd's and nginx's values of
    /// the same round (not the same place in the file), judges each
    /// measure in its own direction, and is left out without nginx.
    #[test]
    fn rounds_pair_ray_dashd_with_nginx_of_the_same_round() {
        let dir = std::env::temp_dir().join(format!("report-rounds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let input = dir.join("latest.jsonl");
        // Round 2 is written before round 1 in nginx's column: paired by
        // their place in the file, the ratios would be 0.82, 1.10, 1.20.
        let lines: Vec<String> = [
            ("dashd", 1, 900, 40),
            ("nginx", 2, 1100, 50),
            ("nginx", 1, 1000, 50),
            ("dashd", 2, 1100, 60),
            ("dashd", 3, 1200, 30),
            ("nginx", 3, 1000, 50),
        ]
        .iter()
        .map(|(target, round, msgs, cpu)| {
            format!(
                r#"{{"kind":"ws","target":"{target}","conns":1,"round":{round},"result":{{"msgs_per_s":{msgs},"cpu_us_per_msg":{cpu}}}}}"#
            )
        })
        .collect();
        std::fs::write(&input, lines.join("\n")).expect("write");
        let text = render(&ReportArgs {
            input: input.clone(),
        })
        .expect("render");
        assert!(
            text.contains("| ws echoes/s, 1 conn | higher | 1.00× | 0.90, 1.00, 1.20 | 2 of 3 |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| proxy CPU per ws echo, 1 conn | lower | 0.80× | 0.80, 1.20, 0.60 | 2 of 3 |"
            ),
            "{text}"
        );
        let without: Vec<&str> = lines
            .iter()
            .map(String::as_str)
            .filter(|l| !l.contains("nginx"))
            .collect();
        std::fs::write(&input, without.join("\n")).expect("write");
        let text = render(&ReportArgs { input }).expect("render");
        assert!(!text.contains("round by round"), "{text}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
