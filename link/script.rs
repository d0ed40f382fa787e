// The linker script that lays out the functions `link/ray-dashd.order`
// lists first: shared by `build.rs`, which writes it for release builds
// (`include!`), and the crate's unit tests (`src/lib.rs` includes it as a
// module under `cfg(test)`), which check the patterns it is made of.

/// The output section the listed functions go to, placed before `.text`.
const HOT_SECTION: &str = ".text.hot";

/// The input-section patterns for the listed functions: first each one
/// exactly (`.text.<symbol>`, only LTO's suffix left open), in the list's
/// order; then, for the same functions, the hash left open too. While the
/// list is fresh the first patterns take every function it names and the
/// second only their siblings (other instances of a generic function,
/// which seldom run) behind them; once a dependency change has renamed the
/// functions, the second still gathers them near the front, with those
/// siblings. Each pattern once; comments, blank lines and names a pattern
/// cannot carry are skipped.
fn section_patterns(order: &str) -> Vec<String> {
    let names: Vec<&str> = order
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let exact = names.iter().filter_map(|name| section_pattern(name, false));
    let open = names.iter().filter_map(|name| section_pattern(name, true));
    exact
        .chain(open)
        .filter(|pattern| seen.insert(pattern.clone()))
        .collect()
}

/// `.text.<symbol>*` for one symbol, with the `.<digits>` that LTO appends
/// to a local symbol it renamed left open, and, when `open_hash`, the
/// legacy mangling's hash too (`17h` and 16 hex digits before the final
/// `E`: Cargo's crates are mangled so; the standard library's `_R` names
/// carry their crate hashes inside and change only with the toolchain).
///
/// `None` for a name with a character that a linker script would read as
/// syntax or as a pattern.
fn section_pattern(symbol: &str, open_hash: bool) -> Option<String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.');
    if symbol.is_empty() || !symbol.chars().all(plain) {
        return None;
    }
    let name = match symbol.rsplit_once('.') {
        Some((name, suffix))
            if !name.is_empty()
                && !suffix.is_empty()
                && suffix.bytes().all(|b| b.is_ascii_digit()) =>
        {
            name
        }
        _ => symbol,
    };
    let stem = match legacy_hash_start(name) {
        Some(at) if open_hash => &name[..at],
        _ => name,
    };
    Some(format!(".text.{stem}*"))
}

/// Where the legacy mangling's hash (`17h` + 16 hex digits + `E`, at the
/// end of a `_ZN` name) begins, past its `17h`.
fn legacy_hash_start(name: &str) -> Option<usize> {
    const HASH: usize = "17h".len() + 16 + "E".len();
    if !name.starts_with("_ZN") || name.len() < HASH {
        return None;
    }
    let tail = &name[name.len() - HASH..];
    let hex = &tail[3..3 + 16];
    (tail.starts_with("17h") && tail.ends_with('E') && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some(name.len() - HASH + 3)
}

/// A script that adds [`HOT_SECTION`], made of `patterns` in their order
/// (each followed by its `.text.unlikely.` twin), before `.text` in the
/// linker's default layout.
fn linker_script(patterns: &[String]) -> String {
    use std::fmt::Write as _;
    let mut script = String::from(
        "/* Written by build.rs from link/ray-dashd.order: the functions ray-dashd\n   \
         runs, first and together. */\nSECTIONS\n{\n",
    );
    let _ = writeln!(script, "  {HOT_SECTION} :\n  {{");
    for pattern in patterns {
        let _ = writeln!(script, "    *({pattern})");
        // A function LLVM deems cold (`#[cold]`, such as a vector's growth
        // or a lock's slow path) comes in `.text.unlikely.<symbol>`.
        if let Some(symbol) = pattern.strip_prefix(".text.") {
            let _ = writeln!(script, "    *(.text.unlikely.{symbol})");
        }
    }
    script.push_str("  }\n}\nINSERT BEFORE .text;\n");
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEGACY: &str = "_ZN5hyper5proto2h14role6Server5parse17h0123456789abcdefE";

    #[test]
    fn a_legacy_name_is_asked_for_exactly_then_with_its_hash_open() {
        assert_eq!(
            section_pattern(LEGACY, false).as_deref(),
            Some(".text._ZN5hyper5proto2h14role6Server5parse17h0123456789abcdefE*")
        );
        assert_eq!(
            section_pattern(LEGACY, true).as_deref(),
            Some(".text._ZN5hyper5proto2h14role6Server5parse17h*")
        );
        // LTO's suffix on a renamed local symbol is always left open.
        let local = format!("{LEGACY}.543");
        assert_eq!(section_pattern(&local, true), section_pattern(LEGACY, true));
        assert_eq!(
            section_pattern(&local, false),
            section_pattern(LEGACY, false)
        );
    }

    #[test]
    fn other_names_keep_everything_but_the_lto_suffix() {
        // A v0 name carries its crate hashes inside: kept whole.
        let v0 = "_RNvXsZ_NtCslNYArtu3iFV_5alloc6stringNtB5_6String9write_str.671";
        assert_eq!(
            section_pattern(v0, true).as_deref(),
            Some(".text._RNvXsZ_NtCslNYArtu3iFV_5alloc6stringNtB5_6String9write_str*")
        );
        // Not a hash: 15 hex digits, or not hex, or not a `_ZN` name.
        for name in [
            "_ZN3foo3bar17h0123456789abcdeE",
            "_ZN3foo3bar17h0123456789abcdegE",
            "malloc_17h0123456789abcdefE",
        ] {
            assert_eq!(section_pattern(name, true), Some(format!(".text.{name}*")));
        }
        // What a script would read as syntax or as a pattern is skipped.
        for name in ["", "a b", "a*b", "a(b)", "a;b", "a[0]"] {
            assert_eq!(section_pattern(name, true), None, "{name:?}");
        }
    }

    #[test]
    fn the_script_asks_for_each_name_once_exactly_first() {
        let order = format!("# comment\n{LEGACY}\n\n{LEGACY}.9\nmain\nbad name\n");
        let patterns = section_patterns(&order);
        assert_eq!(
            patterns,
            [
                format!(".text.{LEGACY}*"),
                ".text.main*".to_owned(),
                ".text._ZN5hyper5proto2h14role6Server5parse17h*".to_owned(),
            ]
        );
        let script = linker_script(&patterns);
        assert!(script.contains("SECTIONS\n{\n  .text.hot :\n  {\n    *(.text._ZN5hyper"));
        assert!(script.trim_end().ends_with("}\n}\nINSERT BEFORE .text;"));
        let exact = script.find(&format!("*(.text.{LEGACY}*)")).expect("exact");
        let open = script.find("17h*)").expect("open");
        assert!(exact < open, "{script}");
        // Each pattern's cold twin right behind it.
        let cold = script
            .find(&format!("*(.text.unlikely.{LEGACY}*)"))
            .expect("cold");
        assert!(exact < cold && cold < script.find("*(.text.main*)").expect("main"));
    }
}
