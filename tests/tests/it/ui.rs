//! The web viewer in a real browser: Debian's chromium, driven through chromedriver
//! (WebDriver) with fantoccini, against the real server.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use spillway_api::SealRequest;
use spillway_client::UploadOptions;

use crate::support::{numbered, Clients, TestServer};

/// chromedriver on a free port, stopped when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn driver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver is not installed: `apt-get install chromium chromium-driver` (scripts/test does it)");
    let driver = Driver { child, url: format!("http://127.0.0.1:{port}") };
    // Ready when it accepts connections; the bound turns a driver that never starts into a failure.
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    driver
}

async fn browser(driver: &Driver, downloads: &std::path::Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "prefs": {"download.default_directory": downloads, "download.prompt_for_download": false},
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,860", "--lang=en-US"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a chromium session")
}

/// The first element matching `css`, waited for (the page fetches as it goes).
async fn find(b: &Client, css: &str) -> Element {
    b.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
}

/// Waits until `css` has exactly `text`.
async fn see_text(b: &Client, css: &str, text: &str) -> Element {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let el = find(b, css).await;
        match el.text().await {
            Ok(t) if t == text => return el,
            Ok(t) => assert!(Instant::now() < deadline, "{css} shows {t:?}, not {text:?}"),
            Err(_) => assert!(Instant::now() < deadline, "{css} went away"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `css` contains `text`.
async fn see_containing(b: &Client, css: &str, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = find(b, css).await.text().await.unwrap_or_default();
        if shown.contains(text) {
            return;
        }
        assert!(Instant::now() < deadline, "{css} shows {shown:?}, never {text:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn fill(b: &Client, css: &str, text: &str) {
    let input = find(b, css).await;
    input.clear().await.unwrap();
    input.send_keys(text).await.unwrap();
}

async fn sign_in(b: &Client, token: &str) {
    fill(b, "#token-input", token).await;
    find(b, "#signin-form button").await.click().await.unwrap();
}

/// Every URL the page loaded or fetched, and where it is now.
async fn urls_visited(b: &Client) -> Vec<String> {
    let names =
        b.execute("return performance.getEntries().map(e => e.name).concat([location.href]);", vec![]).await.unwrap();
    serde_json::from_value(names).unwrap()
}

/// Opens an output through the page's own box, as a user pastes a digest.
async fn open(b: &Client, what: &str) {
    fill(b, "#open-input", what).await;
    find(b, "#open-form button").await.click().await.unwrap();
}

/// Waits until `script` (returning a number) gives one `ok` takes.
async fn until_js(b: &Client, script: &str, ok: impl Fn(f64) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = b.execute(script, vec![]).await.unwrap().as_f64().unwrap_or(-1.0);
        if ok(v) {
            return;
        }
        assert!(Instant::now() < deadline, "never happened: {what} ({v})");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn goto_line(b: &Client, line: u64) {
    fill(b, "#goto-input", &line.to_string()).await;
    find(b, "#goto-form button").await.click().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn viewer_in_a_real_browser() {
    // A search budget this short stops every grep and search call after its first window, as a
    // slow machine would: the viewer must walk on by itself and still show exact counts.
    let srv = TestServer::start_with(|c| c.search_budget = Duration::from_millis(1)).await;
    let c = srv.client();
    let opts = UploadOptions::default().label("tool", "ui-test");
    let big = c.put(Bytes::from(numbered(1_000_000)), &opts).await.unwrap().digest.to_string();
    let evil = "<img src=x onerror=alert(1)><script>alert(2)</script>";
    let evil_digest = c.put(Bytes::from(format!("{evil}\nsecond line\n")), &opts).await.unwrap().digest.to_string();
    let stream = c.create_stream(&opts).await.unwrap();
    let first = numbered(3);
    c.append(&stream.id, 0, Bytes::from(first.clone())).await.unwrap();

    let driver = driver().await;
    let downloads = tempfile::tempdir().unwrap();
    let b = browser(&driver, downloads.path()).await;

    // The UI's answers carry the security headers; `/` leads to it.
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let root = http.get(format!("{}/", srv.url)).send().await.unwrap();
    assert!(root.status().is_redirection());
    assert_eq!(root.headers()["location"], "/ui/");
    for asset in ["/ui/", "/ui/app.js", "/ui/style.css"] {
        let resp = http.get(format!("{}{asset}", srv.url)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{asset}");
        let csp = resp.headers()["content-security-policy"].to_str().unwrap().to_owned();
        assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"), "{asset}: {csp}");
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{asset}: {csp}");
        assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
        assert_eq!(resp.headers()["referrer-policy"], "no-referrer");
    }

    // A wrong token gets a clear message and no way in; the right one opens the page.
    b.goto(&format!("{}/", srv.url)).await.unwrap();
    assert_eq!(b.current_url().await.unwrap().path(), "/ui/");
    sign_in(&b, "not-a-token").await;
    see_containing(&b, "#message", "refused this token (401 unauthorized)").await;
    assert!(find(&b, "#signin").await.is_displayed().await.unwrap());
    sign_in(&b, &srv.token).await;
    find(&b, "#home:not([hidden])").await;

    // Line 1 of a 1,000,000-line blob, then line 999,000: each one page from where it starts.
    let started = Instant::now();
    open(&b, &big).await;
    see_text(&b, ".row[data-n='1']", "line 1").await;
    let line_1 = started.elapsed();
    see_containing(&b, "#meta-refs", "tool=ui-test").await; // the header: when, and what made it
    see_containing(&b, "#meta-refs", "saved 20").await;
    let started = Instant::now();
    goto_line(&b, 999_000).await;
    let row = see_text(&b, ".row[data-n='999000']", "line 999000").await;
    let line_999_000 = started.elapsed();
    assert!(row.is_displayed().await.unwrap());
    assert_eq!(row.attr("class").await.unwrap().as_deref(), Some("row target"));
    eprintln!("viewer, through WebDriver: line 1 shown in {line_1:?}, line 999,000 in {line_999_000:?}");
    // Measured in the page itself: from the address change to the line on screen, alternating.
    let mut shown = [Vec::new(), Vec::new()];
    for round in 0..10 {
        let line = [999_000, 1][round % 2];
        let took = b
            .execute_async(
                "const [digest, line, done] = arguments; const t0 = performance.now();
                 location.hash = `#/blob/${digest}?line=${line}`;
                 const look = () => document.querySelector(`.row.target[data-n='${line}']`)
                   ? done(performance.now() - t0) : requestAnimationFrame(look);
                 look();",
                vec![big.clone().into(), line.into()],
            )
            .await
            .unwrap();
        shown[round % 2].push(took.as_f64().unwrap());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "viewer, in the page (median of 5): line 999,000 in {:.1} ms, line 1 in {:.1} ms",
        median(&mut shown[0]),
        median(&mut shown[1])
    );
    // The whole blob was never fetched: only pages of it.
    let fetched = urls_visited(&b).await;
    let reads: Vec<&String> = fetched.iter().filter(|u| u.contains("/v1/blobs/")).collect();
    assert!(reads.len() >= 2 && reads.iter().all(|u| u.contains("/read?")), "not only pages: {fetched:?}");

    // The lines above are there to scroll up to, and scrolling up fetches more; a line past
    // the end says so.
    goto_line(&b, 999_000).await;
    see_text(&b, ".row.target", "line 999000").await;
    see_text(&b, ".row[data-n='998999']", "line 998999").await;
    b.execute("document.getElementById('content').scrollTop = 0;", vec![]).await.unwrap();
    see_text(&b, ".row[data-n='998001']", "line 998001").await;
    // The jumped-to line has the lines before it in view: it sits about a third of the way down.
    goto_line(&b, 999_000).await;
    see_text(&b, ".row.target", "line 999000").await;
    let where_target = "const c = document.getElementById('content'); const r = c.querySelector('.row.target');
        return r ? (r.getBoundingClientRect().top - c.getBoundingClientRect().top) / c.clientHeight : -1;";
    until_js(&b, where_target, |f| (0.2..0.5).contains(&f), "line 999,000 a third of the way down").await;
    // End: the last line, at the bottom of the screen with the lines before it.
    find(&b, "#to-end").await.click().await.unwrap();
    see_text(&b, ".row.target", "line 1000000").await;
    let bottom = "const c = document.getElementById('content'); const r = c.querySelector('.row.target');
        return r ? (r.getBoundingClientRect().bottom - c.getBoundingClientRect().top) / c.clientHeight : -1;";
    until_js(&b, bottom, |f| (0.9..=1.01).contains(&f), "the last line at the bottom").await;
    see_text(&b, ".row[data-n='999999']", "line 999999").await;
    goto_line(&b, 1_000_002).await;
    see_containing(&b, "#message", "Past the end").await;
    // Scrolling down from line 1 fetches the next pages.
    goto_line(&b, 1).await;
    see_text(&b, ".row.target", "line 1").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.find(Locator::Css(".row[data-n='2000']")).await.is_err() {
        assert!(Instant::now() < deadline, "scrolling down never reached line 2000");
        b.execute("const c = document.getElementById('content'); c.scrollTop = c.scrollHeight;", vec![]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    see_text(&b, ".row[data-n='2000']", "line 2000").await;
    // The permalink names the output and the line, and nothing else.
    find(&b, "#permalink").await.click().await.unwrap();
    see_containing(&b, "#message", &format!("/ui/#/blob/{big}?line=1")).await;

    // Search, jump to a match, and step to the next one.
    fill(&b, "#search-input", "^line 5000[0-9]$").await;
    find(&b, "#search-form button").await.click().await.unwrap();
    see_containing(&b, "#search-status", "10 matching lines from line").await; // from where the screen is
    let greps = urls_visited(&b).await.iter().filter(|u| u.contains("/grep?")).count();
    assert!(greps > 1, "one grep call covered the whole output ({greps}): the walk on was not tried");
    see_text(&b, ".row.target", "line 50000").await;
    see_text(&b, ".row.target mark", "line 50000").await; // the match marked inside its line
    find(&b, "#next-match").await.click().await.unwrap();
    see_text(&b, ".row.target", "line 50001").await;
    see_text(&b, "#results li.current", "50001: line 50001").await;
    find(&b, "#results li:nth-child(5)").await.click().await.unwrap();
    see_text(&b, ".row.target", "line 50004").await;

    // Past the first call's matches: "load more" asks from where it stopped (from line 1 here:
    // a search starts at the line at the top of the screen).
    goto_line(&b, 1).await;
    see_text(&b, ".row.target", "line 1").await;
    fill(&b, "#search-input", "7$").await;
    find(&b, "#search-form button").await.click().await.unwrap();
    see_containing(&b, "#search-status", "200+ matching lines").await;
    find(&b, "#results-more").await.click().await.unwrap();
    see_containing(&b, "#search-status", "400+ matching lines").await;
    see_text(&b, "#results li:nth-child(201)", "2007: line 2007").await;
    // From the middle, the match below comes first, then the search wraps to the one above.
    goto_line(&b, 500_000).await;
    see_text(&b, ".row.target", "line 500000").await;
    fill(&b, "#search-input", "^line (1|999999)$").await;
    find(&b, "#search-form button").await.click().await.unwrap();
    see_containing(&b, "#search-status", "2 matching lines from line").await;
    see_containing(&b, "#search-status", "wrapped").await;
    see_text(&b, "#results li:nth-child(1)", "999999: line 999999").await;
    see_text(&b, "#results li:nth-child(2)", "1: line 1").await;

    // By its SHA-256 too; the exact bytes download.
    let small = "first\nsecond\n";
    let small_rec = c.put(Bytes::from(small), &opts).await.unwrap();
    open(&b, &small_rec.sha256.to_string()).await;
    see_text(&b, ".row[data-n='2']", "second").await;
    find(&b, "#download").await.click().await.unwrap();
    let saved = downloads.path().join(format!("{}.txt", small_rec.digest.hex()));
    crate::support::eventually("the download is saved", || std::fs::read(&saved).is_ok_and(|b| b == small.as_bytes()))
        .await;
    // Bytes that are not UTF-8 are shown as such.
    let binary = c.put(Bytes::from_static(b"\x00\xff\xfe binary\n"), &opts).await.unwrap();
    open(&b, &binary.digest.to_string()).await;
    see_text(&b, ".row[data-n='1']", "\u{0}\u{FFFD}\u{FFFD} binary").await;
    assert!(find(&b, "#binary-note").await.is_displayed().await.unwrap());

    // Markup in an output is text: shown as written, and nothing runs.
    open(&b, &evil_digest).await;
    see_text(&b, ".row[data-n='1']", evil).await;
    see_text(&b, ".row[data-n='2']", "second line").await;
    assert!(b.get_alert_text().await.is_err(), "an alert opened");
    let made =
        b.execute("return [document.querySelectorAll('img').length, document.scripts.length];", vec![]).await.unwrap();
    assert_eq!(made, serde_json::json!([0, 1]), "the output made elements");

    // A stream still being written: its lines, then new ones as they arrive, then its end.
    b.goto(&format!("{}/ui/#/stream/{}", srv.url, stream.id)).await.unwrap();
    see_text(&b, ".row[data-n='3']", "line 3").await;
    see_containing(&b, "#stream-state", "open").await;
    see_containing(&b, "#follow-note", "Following").await;
    c.append(&stream.id, first.len() as u64, Bytes::from("line 4\nline 5\n")).await.unwrap();
    see_text(&b, ".row[data-n='5']", "line 5").await;
    // More than a screen: the view keeps to the bottom while the user is there ...
    let more: String = (6..=200).map(|i| format!("line {i}\n")).collect();
    let mut size = c.stream_info(&stream.id).await.unwrap().size;
    c.append(&stream.id, size, Bytes::from(more.clone())).await.unwrap();
    size += more.len() as u64;
    see_text(&b, ".row[data-n='200']", "line 200").await;
    let at_bottom = "const c = document.getElementById('content');                      return c.scrollHeight - c.scrollTop - c.clientHeight < 4;";
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.execute(at_bottom, vec![]).await.unwrap() != serde_json::json!(true) {
        assert!(Instant::now() < deadline, "the view did not follow the new lines");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... and stays where the user scrolled to.
    b.execute("document.getElementById('content').scrollTop = 0;", vec![]).await.unwrap();
    see_containing(&b, "#follow-note", "Paused").await;
    c.append(&stream.id, size, Bytes::from("line 201\n")).await.unwrap();
    see_text(&b, ".row[data-n='201']", "line 201").await;
    let top = b.execute("return document.getElementById('content').scrollTop;", vec![]).await.unwrap();
    assert_eq!(top, serde_json::json!(0), "the view moved while the user read above");
    c.seal_with(&stream.id, &SealRequest { exit_code: Some(3), signal: None }).await.unwrap();
    see_containing(&b, "#stream-state", "sealed · exit 3").await;
    see_containing(&b, "#follow-note", "ended").await;

    // Search all outputs: a line found in one of them, and its result opens it at that line.
    b.goto(&format!("{}/ui/#/search", srv.url)).await.unwrap();
    fill(&b, "#find-pattern", "^line 777777$").await;
    fill(&b, "#find-labels", "tool=ui-test").await;
    find(&b, "#find-form button").await.click().await.unwrap();
    see_containing(&b, "#find-status", "1 match in").await;
    assert!(!find(&b, "#find-status").await.text().await.unwrap().contains("more to search"));
    see_containing(&b, "#find-results li.output", &big).await;
    see_text(&b, "#find-results li.hit", "777777: line 777777").await;
    find(&b, "#find-results li.hit a").await.click().await.unwrap();
    see_text(&b, ".row.target", "line 777777").await;
    assert!(b.current_url().await.unwrap().fragment().unwrap().ends_with(&format!("{big}?line=777777")));
    // Markup found by a search is text there too.
    b.goto(&format!("{}/ui/#/search?pattern=onerror&fixed=true", srv.url)).await.unwrap();
    see_text(&b, "#find-results li.hit", &format!("1: {evil}")).await;
    assert!(b.get_alert_text().await.is_err(), "an alert opened");

    // Browse this namespace's outputs by label.
    b.goto(&format!("{}/ui/#/refs?label.tool=ui-test", srv.url)).await.unwrap();
    find(&b, "#refs-table tbody tr:nth-child(3)").await;
    let listed = b.execute("return document.querySelectorAll('#refs-table tbody tr').length;", vec![]).await.unwrap();
    assert_eq!(listed, 5, "four uploads and the sealed stream");

    // The token was never in a URL the browser visited, a cookie or local storage.
    let visited = urls_visited(&b).await;
    assert!(visited.len() > 10, "{visited:?}");
    assert!(visited.iter().all(|u| !u.contains(&srv.token)), "the token is in a URL: {visited:?}");
    let kept = b.execute("return [document.cookie, localStorage.length];", vec![]).await.unwrap();
    assert_eq!(kept, serde_json::json!(["", 0]));

    b.close().await.unwrap();
}

/// The README's picture: the viewer on a real log, searched. Run by hand:
/// `SPILLWAY_UI_LOG=/var/log/dpkg.log cargo test -p spillway-tests --test it ui::screenshot -- --ignored`
/// writes `docs/viewer.png`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "writes docs/viewer.png; run by hand"]
async fn screenshot() {
    let log = std::env::var("SPILLWAY_UI_LOG").unwrap_or_else(|_| "/var/log/dpkg.log".into());
    let pattern = std::env::var("SPILLWAY_UI_SEARCH").unwrap_or_else(|_| "status installed chromium".into());
    let srv = TestServer::start().await;
    let c = srv.client();
    let opts = UploadOptions::default().label("tool", "bash").label("stream", "stdout");
    let digest = c.put(Bytes::from(std::fs::read(&log).unwrap()), &opts).await.unwrap().digest.to_string();
    let driver = driver().await;
    let downloads = tempfile::tempdir().unwrap();
    let b = browser(&driver, downloads.path()).await;
    b.goto(&format!("{}/ui/", srv.url)).await.unwrap();
    sign_in(&b, &srv.token).await;
    find(&b, "#home:not([hidden])").await;
    open(&b, &digest).await;
    find(&b, ".row[data-n='1']").await;
    fill(&b, "#search-input", &pattern).await;
    find(&b, "#search-form button").await.click().await.unwrap();
    find(&b, "#results li.current").await;
    let png = b.screenshot().await.unwrap();
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/viewer.png");
    std::fs::write(&out, png).unwrap();
    b.close().await.unwrap();
}
