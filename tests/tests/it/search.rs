//! Search across a namespace's outputs (api.md v1.2) through the real server and client: the
//! filters, the order, the caps, the budget, exactly-once cursors while outputs come and go,
//! namespace isolation, redaction and the contract's errors.

use std::collections::HashSet;

use bytes::Bytes;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use spillway_api::SearchMatch;
use spillway_client::{SearchRequest, StoreClient, UploadOptions};

use crate::support::{api_code, Clients, TestServer, ALL};

fn find(pattern: &str) -> SearchRequest {
    SearchRequest { pattern: pattern.into(), ..Default::default() }
}

/// Every match of a search, following its cursor (with `between` run before each next page).
async fn walk(c: &StoreClient, mut s: SearchRequest, mut between: impl FnMut(usize)) -> Vec<SearchMatch> {
    let mut all = Vec::new();
    for page in 0.. {
        let found = c.search(&s).await.unwrap();
        let shown: HashSet<&str> = found.matches.iter().map(|m| m.digest.as_str()).collect();
        assert_eq!(found.outputs_matched, shown.len() as u64, "outputs matched are those with a match shown");
        all.extend(found.matches);
        match found.next_cursor {
            Some(cur) => s.cursor = Some(cur),
            None => return all,
        }
        between(page);
        assert!(page < 10_000, "the walk ends");
    }
    unreachable!()
}

#[tokio::test]
async fn matches_come_newest_output_first_with_their_labels_and_filters_narrow_them() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let put = |text: &str, session: &str, tool: &str| {
        let opts = UploadOptions::default().label("session", session).label("tool", tool);
        let c = c.clone();
        let text = text.to_owned();
        async move { c.put(Bytes::from(text), &opts).await.unwrap().digest }
    };
    let old = put("ok\nerror[E0308]: mismatched types\nok\n", "s-1", "cargo").await;
    srv.clock.advance_secs(3600);
    let mid = put("booting\nOOMKilled\nerror[E0308] again\n", "s-2", "kubectl").await;
    let new = put("error[E0308]\n", "s-2", "cargo").await;
    // The same content again under other labels: searched once, with its newest reference's labels.
    put("ok\nerror[E0308]: mismatched types\nok\n", "s-3", "cargo").await;
    let found = c.search(&find("error\\[E0308\\]")).await.unwrap();
    let got: Vec<(String, u64, String)> =
        found.matches.iter().map(|m| (m.digest.clone(), m.found.line, m.labels["session"].to_owned())).collect();
    let want = vec![
        (old.to_string(), 2, "s-3".to_owned()),
        (new.to_string(), 1, "s-2".to_owned()),
        (mid.to_string(), 3, "s-2".to_owned()),
    ];
    assert_eq!(got, want, "newest reference first, each output once");
    assert_eq!((found.outputs_scanned, found.outputs_matched, found.capped, found.next_cursor), (3, 3, false, None));
    assert_eq!(found.matches[0].found.text, "error[E0308]: mismatched types");
    // Labels: all must match.
    let mut s = find("E0308");
    s.labels = vec![("session".into(), "s-2".into()), ("tool".into(), "cargo".into())];
    let found = c.search(&s).await.unwrap();
    assert_eq!(found.matches.iter().map(|m| m.digest.clone()).collect::<Vec<_>>(), [new.to_string()]);
    // Times: since/until on the reference's creation, as a duration back, Unix seconds or RFC 3339.
    let mut s = find("E0308");
    s.since = Some("30m".into());
    assert_eq!(c.search(&s).await.unwrap().matches.len(), 3, "the old output's newest reference is recent");
    let mut s = find("OOMKilled");
    s.until = Some("2h".into());
    assert!(c.search(&s).await.unwrap().matches.is_empty(), "nothing was stored two hours before the clock");
    s.until = Some(format!("{}", srv.state.now() / 1000 + 1));
    assert_eq!(c.search(&s).await.unwrap().matches.len(), 1);
    s.since = Some("2999-01-01T00:00:00Z".into());
    assert!(c.search(&s).await.unwrap().matches.is_empty());
    // Context lines, as grep gives them.
    let mut s = find("OOMKilled");
    (s.before, s.after) = (Some(1), Some(1));
    let m = &c.search(&s).await.unwrap().matches[0];
    assert_eq!((m.found.before[0].text.as_str(), m.found.after[0].text.as_str()), ("booting", "error[E0308] again"));
    srv.stop().await;
}

/// A walk with small pages gives every match exactly once, in the order of a brute force over
/// the same references: newest output first, lines in order.
#[tokio::test]
async fn cursors_give_every_match_exactly_once() {
    for threads in [1, 4] {
        cursors_give_every_match_exactly_once_on(threads).await;
    }
}

/// The same on a server that scans `threads` outputs at once (`heavy_threads`).
async fn cursors_give_every_match_exactly_once_on(threads: usize) {
    let srv = TestServer::start_with(|c| c.heavy_threads = threads).await;
    let c = srv.client();
    for seed in 0..3u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let tag = format!("t{seed}");
        let mut outputs = Vec::new();
        for i in 0..40 {
            let lines: String = (0..rng.random_range(1..200))
                .map(|l| if rng.random_bool(0.1) { format!("hit {i}.{l}\n") } else { format!("miss {l}\n") })
                .collect();
            let opts = UploadOptions::default().label("walk", &tag);
            outputs.push((c.put(Bytes::from(lines.clone()), &opts).await.unwrap().digest, lines));
        }
        let expected: Vec<(String, u64)> = outputs
            .iter()
            .rev()
            .flat_map(|(d, text)| {
                let hits = text.lines().enumerate().filter(|(_, l)| l.starts_with("hit"));
                hits.map(move |(n, _)| (d.to_string(), n as u64 + 1))
            })
            .collect();
        let mut s = find("^hit");
        s.labels = vec![("walk".into(), tag.clone())];
        s.max_matches = Some(rng.random_range(1..7));
        let got = walk(&c, s, |_| {}).await;
        let pairs: Vec<(String, u64)> = got.iter().map(|m| (m.digest.clone(), m.found.line)).collect();
        assert_eq!(pairs, expected, "seed {seed}, {threads} threads: every match once, in order");
    }
    srv.stop().await;
}

/// The same walk, with outputs added and deleted between the requests.
#[tokio::test]
async fn a_walk_skips_what_is_deleted_and_never_sees_what_came_later() {
    for threads in [1, 4] {
        a_walk_skips_what_is_deleted_on(threads).await;
    }
}

async fn a_walk_skips_what_is_deleted_on(threads: usize) {
    let srv = TestServer::start_with(|c| c.heavy_threads = threads).await;
    let c = srv.client();
    let mut outputs = Vec::new();
    for i in 0..30 {
        let text: String = (0..50).map(|l| format!("{} {i}.{l}\n", if l % 5 == 0 { "hit" } else { "miss" })).collect();
        outputs.push(c.put(Bytes::from(text), &UploadOptions::default().label("walk", "w")).await.unwrap().digest);
    }
    let mut s = find("^hit");
    s.labels = vec![("walk".into(), "w".into())];
    s.max_matches = Some(7);
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    let mut deleted = HashSet::new();
    let mut page = 0;
    loop {
        let found = c.search(&s).await.unwrap();
        for m in &found.matches {
            assert!(seen.insert((m.digest.clone(), m.found.line)), "{}:{} twice", m.digest, m.found.line);
            assert!(!deleted.contains(&m.digest), "{} was deleted before it was reached", m.digest);
            if order.last() != Some(&m.digest) {
                order.push(m.digest.clone());
            }
        }
        let Some(cur) = found.next_cursor else { break };
        s.cursor = Some(cur);
        page += 1;
        // Something new every page, never to be searched; an old output deleted every third.
        let text = format!("hit late {page}\n");
        c.put(Bytes::from(text), &UploadOptions::default().label("walk", "w")).await.unwrap();
        if page % 3 == 0 {
            let victim = outputs[page / 3 - 1];
            if !order.contains(&victim.to_string()) {
                c.delete(victim).await.unwrap();
                deleted.insert(victim.to_string());
            }
        }
    }
    let want: Vec<String> = outputs.iter().rev().map(|d| d.to_string()).filter(|d| !deleted.contains(d)).collect();
    assert_eq!(order, want, "the first request's outputs, in its order, the deleted ones skipped");
    assert_eq!(seen.len(), want.len() * 10, "every match of every output left");
    assert!(!deleted.is_empty(), "the walk did delete some outputs ahead of it");
    srv.stop().await;
}

/// An output is searched once even when the reference it was searched by goes before the walk
/// reaches an older reference of it: pinned (a newer reference), searched by the pin, then
/// unpinned, its older reference still live further down the walk.
#[tokio::test]
async fn an_output_searched_by_a_reference_since_removed_is_not_searched_again() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let twice = c.put(Bytes::from("hit twice-referenced\n"), &UploadOptions::default()).await.unwrap().digest;
    for i in 0..40 {
        c.put(Bytes::from(format!("hit filler {i}\n")), &UploadOptions::default()).await.unwrap();
    }
    c.pin(twice, Some("evidence")).await.unwrap(); // a newer reference: searched by this one
    let mut s = find("^hit");
    s.max_matches = Some(5);
    let mut lines = Vec::new();
    let mut page = 0;
    loop {
        let found = c.search(&s).await.unwrap();
        lines.extend(found.matches.iter().map(|m| m.found.text.clone()));
        if page == 0 {
            assert_eq!(found.matches[0].digest, twice.to_string(), "searched first, by its pin");
            c.unpin(twice).await.unwrap(); // its older reference is still there, further down
        }
        page += 1;
        match found.next_cursor {
            Some(cur) => s.cursor = Some(cur),
            None => break,
        }
    }
    assert_eq!(lines.iter().filter(|l| l.contains("twice")).count(), 1, "{lines:?}");
    assert_eq!(lines.len(), 41, "every output once");
    srv.stop().await;
}

/// An answer's work is bounded whatever the namespace holds: with a budget that never runs
/// out, the first answer of a search of 2,100 outputs searches 2,000 of them and hands out a
/// cursor, and the next one the last 100.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_searches_a_bounded_part_of_a_large_namespace() {
    let srv = TestServer::start_with(|c| c.search_budget = std::time::Duration::from_secs(600)).await;
    let c = srv.client();
    let puts = (0..2_100).map(|i| {
        let c = c.clone();
        async move { c.put(Bytes::from(format!("line {i}\n")), &UploadOptions::default()).await.unwrap() }
    });
    futures::stream::iter(puts).buffer_unordered(16).collect::<Vec<_>>().await;
    let mut s = find("found nowhere");
    let first = c.search(&s).await.unwrap();
    assert_eq!(first.outputs_scanned, 2_000, "one bounded part");
    s.cursor = Some(first.next_cursor.expect("a cursor for the rest"));
    let rest = c.search(&s).await.unwrap();
    assert_eq!((rest.outputs_scanned, rest.next_cursor), (100, None));
    srv.stop().await;
}

#[tokio::test]
async fn answers_are_capped_and_say_so() {
    for threads in [1, 4] {
        answers_are_capped_on(threads).await;
    }
}

/// With more than one thread, outputs after the one that fills the answer were scanned too:
/// what they found is dropped, and found again from the cursor.
async fn answers_are_capped_on(threads: usize) {
    let srv = TestServer::start_with(|c| c.heavy_threads = threads).await;
    let c = srv.client();
    for i in 0..3 {
        let text: String = (0..2000).map(|l| format!("match {i}.{l} {}\n", "x".repeat(90))).collect();
        c.put(Bytes::from(text), &UploadOptions::default()).await.unwrap();
    }
    let found = c.search(&find("match")).await.unwrap();
    assert_eq!(found.matches.len(), 100, "the default max_matches");
    assert!(found.capped && found.next_cursor.is_some());
    let mut s = find("match");
    s.max_matches = Some(1000);
    let found = c.search(&s).await.unwrap();
    let text: usize = found.matches.iter().map(|m| m.found.text.len()).sum();
    assert!(text <= 100_000 && text > 90_000, "at most 100,000 bytes of text: {text}");
    assert!(found.capped && found.next_cursor.is_some());
    let all = walk(&c, s, |_| {}).await;
    assert_eq!(all.len(), 6000);
    srv.stop().await;
}

/// One request works for about the budget, however much is left — inside one large output
/// too — and says where to go on.
#[tokio::test]
async fn a_request_stops_at_the_budget_inside_a_large_output() {
    let srv = TestServer::start_with(|c| c.search_budget = std::time::Duration::from_millis(5)).await;
    let c = srv.client();
    let line = format!("{}\n", "y".repeat(99));
    let big = line.repeat(600_000) + "needle at the end\n"; // 60 MB
    let d = c.put(Bytes::from(big), &UploadOptions::default()).await.unwrap().digest;
    let t = std::time::Instant::now();
    let found = c.search(&find("needle")).await.unwrap();
    let took = t.elapsed();
    assert!(found.next_cursor.is_some(), "60 MB are not scanned in 5 ms");
    assert!(took < std::time::Duration::from_millis(500), "answered at about the budget: {took:?}");
    assert!(found.matches.is_empty() && found.outputs_scanned == 1 && !found.capped);
    let all = walk(&c, find("needle"), |_| {}).await;
    assert_eq!(all.iter().map(|m| (m.digest.clone(), m.found.line)).collect::<Vec<_>>(), [(d.to_string(), 600_001)]);
    srv.stop().await;
}

/// Nothing of another namespace: no match, no count, and its cursors are refused; a cursor is
/// bound to its query too.
#[tokio::test]
async fn namespaces_see_only_their_own_outputs_and_cursors() {
    let srv = TestServer::start().await;
    let a = srv.client();
    let b = srv.client_for("ns-b", ALL).await;
    for i in 0..5 {
        b.put(Bytes::from(format!("secret-of-b {i}\n")), &UploadOptions::default()).await.unwrap();
        a.put(Bytes::from(format!("line of a {i}\n")), &UploadOptions::default()).await.unwrap();
    }
    let found = a.search(&find("secret-of-b")).await.unwrap();
    assert_eq!((found.matches.len(), found.outputs_scanned, found.outputs_matched), (0, 5, 0));
    let mut s = find("of");
    s.max_matches = Some(1);
    let cursor = a.search(&s).await.unwrap().next_cursor.expect("more to find");
    let mut theirs = find("of");
    theirs.cursor = Some(cursor.clone());
    let e = b.search(&theirs).await.unwrap_err();
    assert_eq!(api_code(&e), (400, "invalid_argument".into()), "another namespace's cursor");
    let mut other_query = find("line");
    other_query.cursor = Some(cursor.clone());
    assert_eq!(api_code(&a.search(&other_query).await.unwrap_err()).0, 400, "another pattern");
    let mut forged = find("of");
    // A character in the middle: all its bits are the cursor's (the last one's may be padding,
    // and may even be the character put in its place).
    let mid = cursor.len() / 2;
    let other = if &cursor[mid..mid + 1] == "A" { "B" } else { "A" };
    forged.cursor = Some(format!("{}{other}{}", &cursor[..mid], &cursor[mid + 1..]));
    assert_eq!(api_code(&a.search(&forged).await.unwrap_err()).0, 400, "a changed cursor");
    let mut more = find("of");
    more.max_matches = Some(50);
    more.cursor = Some(cursor);
    assert_eq!(a.search(&more).await.unwrap().matches.len(), 4, "max_matches may change");
    srv.stop().await;
}

#[tokio::test]
async fn bad_queries_get_the_contracts_errors() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let status = |q: &'static str| {
        let req = c.request(reqwest::Method::GET, &format!("/v1/search?{q}"));
        async move {
            let r = req.send().await.unwrap();
            let s = r.status().as_u16();
            (s, r.json::<serde_json::Value>().await.unwrap()["error"]["code"].as_str().unwrap_or_default().to_owned())
        }
    };
    for q in [
        "",
        "pattern=(",
        "pattern=x&max_matches=0",
        "pattern=x&max_matches=1001",
        "pattern=x&since=yesterday",
        "pattern=x&before=101",
        "pattern=x&cursor=nope",
        "pattern=x&label.BAD=1",
        "pattern=x&ignore_case=maybe",
    ] {
        assert_eq!(status(q).await, (400, "invalid_argument".to_owned()), "{q:?}");
    }
    let write_only = srv.client_for("ns-a", &[spillway_api::Scope::Write]).await;
    assert_eq!(api_code(&write_only.search(&find("x")).await.unwrap_err()), (403, "forbidden".into()));
    let nobody = StoreClient::new(&srv.url, "spw_nope");
    assert_eq!(api_code(&nobody.search(&find("x")).await.unwrap_err()).0, 401);
    srv.stop().await;
}

/// With redaction the pattern matches the marked text: a secret cannot be probed, a mark can be
/// found; a redacted token searches marked text whatever it asks.
#[tokio::test]
async fn searches_read_marks_when_redacted() {
    let srv = TestServer::start().await;
    let c = srv.client();
    let secret = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";
    c.put(Bytes::from(format!("GITHUB_TOKEN={secret}\n")), &UploadOptions::default()).await.unwrap();
    assert_eq!(c.search(&find("ghp_")).await.unwrap().matches.len(), 1, "an SRE's ordinary search");
    let marked = c.clone().redacting(true);
    assert!(marked.search(&find("ghp_")).await.unwrap().matches.is_empty());
    let found = marked.search(&find("GITHUB_TOKEN")).await.unwrap();
    assert_eq!(
        (found.matches[0].found.text.as_str(), found.redactions),
        ("GITHUB_TOKEN=[REDACTED:github_token]", Some(1))
    );
    let agent = StoreClient::new(&srv.url, srv.redacted_token("ns-a", ALL).await);
    assert!(agent.search(&find("ghp_")).await.unwrap().matches.is_empty(), "a redacted token cannot opt out");
    srv.stop().await;
}
