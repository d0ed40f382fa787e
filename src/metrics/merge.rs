//! Two OpenMetrics texts as one: the series another exporter serves put
//! into the families of this one's, for a scrape that must show both on one
//! port (Ray's own dashboard process holds Ray's dashboard metrics port
//! beside ray-dashd: see `crate::ray::metrics_port`).
//!
//! A family may appear only once in a scrape, so the other's samples go
//! under this one's family of the same name and type; a family of the same
//! name but another type is left out (a scrape with both would be refused
//! whole), and so is a series this one has already (same name and labels).

use std::collections::{HashMap, HashSet};

/// One metric family of an OpenMetrics text: its metadata lines (`# HELP`,
/// `# TYPE`, `# UNIT`) and its sample lines, as written.
#[derive(Debug)]
struct Family<'a> {
    name: &'a str,
    kind: &'a str,
    meta: Vec<&'a str>,
    samples: Vec<&'a str>,
}

/// The families of `text` in order. A sample before any metadata forms a
/// family of its own, of type `unknown`.
fn families(text: &str) -> Vec<Family<'_>> {
    let mut out: Vec<Family<'_>> = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            let (Some(what), Some(name)) = (words.next(), words.next()) else {
                continue;
            };
            if !matches!(what, "HELP" | "TYPE" | "UNIT") {
                continue;
            }
            if out
                .last()
                .is_none_or(|f| f.name != name || !f.samples.is_empty())
            {
                out.push(Family {
                    name,
                    kind: "unknown",
                    meta: Vec::new(),
                    samples: Vec::new(),
                });
            }
            let family = out.last_mut().expect("UNWRAP: pushed just above");
            if what == "TYPE" {
                family.kind = words.next().unwrap_or("unknown").trim();
            }
            family.meta.push(line);
            continue;
        }
        let series = series_of(line);
        let metric = series.split('{').next().unwrap_or(series);
        match out.last_mut() {
            Some(family) if metric.starts_with(family.name) => family.samples.push(line),
            _ => out.push(Family {
                name: metric,
                kind: "unknown",
                meta: Vec::new(),
                samples: vec![line],
            }),
        }
    }
    out
}

/// The series a sample line is of: its name and labels, without the value,
/// timestamp or exemplar. Label values may hold spaces and braces, quoted.
fn series_of(line: &str) -> &str {
    let Some(open) = line.find('{').filter(|open| !line[..*open].contains(' ')) else {
        return line.split(' ').next().unwrap_or(line);
    };
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line[open..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return &line[..open + i + 1],
            _ => {}
        }
    }
    line
}

/// `ours` with `theirs`' series added to it, as OpenMetrics text (ending
/// in `# EOF`). Both must be OpenMetrics text.
pub fn merge_openmetrics(ours: &str, theirs: &str) -> String {
    let mut merged = families(ours);
    let mut index: HashMap<&str, usize> = merged
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name, i))
        .collect();
    let mut seen: HashSet<&str> = merged
        .iter()
        .flat_map(|f| f.samples.iter().map(|s| series_of(s)))
        .collect();
    for family in families(theirs) {
        let samples: Vec<&str> = family
            .samples
            .into_iter()
            .filter(|s| seen.insert(series_of(s)))
            .collect();
        match index.get(family.name) {
            Some(&i) if merged[i].kind == family.kind => merged[i].samples.extend(samples),
            Some(_) => {}
            None => {
                index.insert(family.name, merged.len());
                merged.push(Family { samples, ..family });
            }
        }
    }
    let mut out = String::with_capacity(ours.len() + theirs.len());
    for family in &merged {
        for line in family.meta.iter().chain(&family.samples) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "\
# HELP ray_component_rss_mb RSS usage of all processes.
# TYPE ray_component_rss_mb gauge
ray_component_rss_mb{Component=\"dashboard\",pid=\"1\"} 12.5
# HELP ray_dashboard_api_requests_count_requests Total requests.
# TYPE ray_dashboard_api_requests_count_requests counter
ray_dashboard_api_requests_count_requests_total{endpoint=\"/nodes\"} 3
# EOF
";

    /// Another exporter's: one series ours has already (pid 1), one family
    /// of another type than ours.
    const THEIRS: &str = "\
# HELP ray_component_rss_mb RSS usage of all processes.
# TYPE ray_component_rss_mb gauge
ray_component_rss_mb{Component=\"dashboard\",pid=\"2\"} 120.0
ray_component_rss_mb{Component=\"dashboard\",pid=\"1\"} 99.0
# HELP ray_dashboard_event_loop_tasks Tasks in the event loop.
# TYPE ray_dashboard_event_loop_tasks gauge
ray_dashboard_event_loop_tasks{Component=\"dashboard\",pid=\"2\"} 4.0
# HELP ray_dashboard_api_requests_count_requests Not a counter here.
# TYPE ray_dashboard_api_requests_count_requests gauge
ray_dashboard_api_requests_count_requests{endpoint=\"/x\"} 1.0
# EOF
";

    #[test]
    fn their_series_join_our_families_once_each() {
        let merged = merge_openmetrics(OURS, THEIRS);
        let expected = "\
# HELP ray_component_rss_mb RSS usage of all processes.
# TYPE ray_component_rss_mb gauge
ray_component_rss_mb{Component=\"dashboard\",pid=\"1\"} 12.5
ray_component_rss_mb{Component=\"dashboard\",pid=\"2\"} 120.0
# HELP ray_dashboard_api_requests_count_requests Total requests.
# TYPE ray_dashboard_api_requests_count_requests counter
ray_dashboard_api_requests_count_requests_total{endpoint=\"/nodes\"} 3
# HELP ray_dashboard_event_loop_tasks Tasks in the event loop.
# TYPE ray_dashboard_event_loop_tasks gauge
ray_dashboard_event_loop_tasks{Component=\"dashboard\",pid=\"2\"} 4.0
# EOF
";
        assert_eq!(merged, expected);
    }

    #[test]
    fn a_series_is_its_name_and_labels() {
        assert_eq!(series_of("a_total 3"), "a_total");
        assert_eq!(series_of("a{x=\"1\"} 3 1700000000"), "a{x=\"1\"}");
        assert_eq!(
            series_of("a{x=\"} {\\\"\"} 3 # {trace=\"t\"} 1"),
            "a{x=\"} {\\\"\"}"
        );
    }

    #[test]
    fn nothing_of_theirs_leaves_ours_as_it_was() {
        assert_eq!(merge_openmetrics(OURS, ""), OURS);
        assert_eq!(merge_openmetrics("", "# EOF\n"), "# EOF\n");
    }
}
