use super::samples::{CLEAN, SAMPLES};
use super::*;

#[test]
fn every_kind_is_found_and_only_its_secret_is_marked() {
    let d = Detector::builtin();
    for (kind, text, secret) in SAMPLES {
        let spans = d.find(text.as_bytes());
        assert_eq!(spans.len(), 1, "{kind}: {text:?} -> {spans:?}");
        let s = &spans[0];
        assert_eq!(&*s.kind, *kind, "{text:?}");
        assert_eq!(&text.as_bytes()[s.start..s.end], secret.as_bytes(), "{kind}: {text:?}");
        let (out, n) = apply(text.as_bytes(), &spans);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(n, 1);
        assert!(out.contains(&format!("[REDACTED:{kind}]")), "{out}");
        assert!(!out.contains(secret), "{out}");
        assert_eq!(out.matches('\n').count(), text.matches('\n').count(), "lines keep their numbers: {out:?}");
    }
}

#[test]
fn nothing_is_found_where_there_is_no_secret() {
    let d = Detector::builtin();
    for text in CLEAN {
        assert_eq!(d.find(text.as_bytes()), vec![], "{text:?}");
    }
}

#[test]
fn the_more_specific_kind_wins() {
    let d = Detector::builtin();
    let kinds = |t: &str| d.find(t.as_bytes()).into_iter().map(|s| s.kind.to_string()).collect::<Vec<_>>();
    assert_eq!(kinds("sk-ant-api03-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9"), ["anthropic_key"]);
    assert_eq!(kinds("GITHUB_TOKEN=ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"), ["github_token"]);
    assert_eq!(kinds("Authorization: Bearer sk-proj-4fJ8kL2mN9pQ1rS5tU7vW3xY6zA0bC"), ["openai_key"]);
    assert_eq!(kinds("https://u:ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789@github.com"), ["github_token"]);
}

#[test]
fn a_scan_of_part_of_a_text_finds_what_the_whole_scan_finds_there() {
    let d = Detector::builtin();
    let mut text = String::new();
    for (i, (_, sample, _)) in SAMPLES.iter().cycle().take(200).enumerate() {
        text.push_str(&format!("line {i} {sample}\n"));
    }
    let text = text.as_bytes();
    let whole = d.find(text);
    for (from, to) in [(0usize, 500usize), (777, 3000), (5000, 5001), (1234, text.len())] {
        let lo = from.saturating_sub(MAX_SECRET);
        let hi = text.len().min(to + MAX_SECRET);
        let part: Vec<(usize, usize)> =
            d.find_starting_in(&text[lo..hi], from - lo, to - lo).iter().map(|s| (s.start + lo, s.end + lo)).collect();
        let want: Vec<(usize, usize)> =
            whole.iter().filter(|s| (from..to).contains(&s.start)).map(|s| (s.start, s.end)).collect();
        assert_eq!(part, want, "{from}..{to}");
    }
}

#[test]
fn operators_add_kinds_in_gitleaks_format() {
    let rules = r#"
        [[rules]]
        id = "acme_key"
        regex = '''acme_(?:live|test)_([a-z0-9]{16})'''
        keywords = ["acme_"]
        secretGroup = 1
    "#;
    let d = Detector::with_rules(rules).unwrap();
    let spans = d.find(b"ACME=acme_live_0123456789abcdef");
    assert_eq!(spans.len(), 1);
    assert_eq!((&*spans[0].kind, spans[0].start), ("acme_key", 15));
    assert!(Detector::with_rules("[[rules]]\nid = 'x'\nregex = '('").is_err(), "a pattern that does not compile");
    assert!(Detector::with_rules("not toml [").is_err());
}
