//! Samples of every kind (real formats, fake values) and of text that looks like a secret but
//! is none: the detector's tests, the server's and the client's, share them.

/// One sample per kind: real formats, fake values. `(kind, text, the secret in it)`.
pub const SAMPLES: &[(&str, &str, &str)] = &[
    ("aws_access_key_id", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_access_key_id", "export AWS_ACCESS_KEY_ID=ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A"),
    (
        "aws_secret_access_key",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    (
        "aws_secret_access_key",
        r#"{"AWS_SECRET_ACCESS_KEY": "Zx9Q2mV8rT4kL1pN6bY3wE7aS0dF5gH2jK8lM4nB"}"#,
        "Zx9Q2mV8rT4kL1pN6bY3wE7aS0dF5gH2jK8lM4nB",
    ),
    ("github_token", "git clone https://ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789@github.com/o/r", "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"),
    ("github_token", "GITHUB_TOKEN=ghs_16C7e42F292c6912E7710c838347Ae178B4a", "ghs_16C7e42F292c6912E7710c838347Ae178B4a"),
    (
        "github_token",
        "token: github_pat_11ABCDEFG0123456789abc_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456",
        "github_pat_11ABCDEFG0123456789abc_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456",
    ),
    ("gitlab_token", "PRIVATE-TOKEN: glpat-xxxxYYYYzzzz12345678", "glpat-xxxxYYYYzzzz12345678"),
    ("slack_token", "SLACK_BOT=xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"),
    ("stripe_key", "Stripe.api_key = sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("stripe_key", "rk_live_51H8abcdEFGH1234ijkl", "rk_live_51H8abcdEFGH1234ijkl"),
    ("openai_key", "OPENAI_API_KEY=sk-proj-4fJ8kL2mN9pQ1rS5tU7vW3xY6zA0bC", "sk-proj-4fJ8kL2mN9pQ1rS5tU7vW3xY6zA0bC"),
    ("openai_key", "using key sk-9aB8cD7eF6gH5iJ4kL3mN2oP1qR0sT", "sk-9aB8cD7eF6gH5iJ4kL3mN2oP1qR0sT"),
    ("anthropic_key", "x-api-key: sk-ant-api03-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv-wxyzAA", "sk-ant-api03-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv-wxyzAA"),
    ("huggingface_token", "HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"),
    ("npm_token", "//registry.npmjs.org/:_authToken=npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    ("google_api_key", "?key=AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW", "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"),
    (
        "jwt",
        "id_token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk end",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk",
    ),
    (
        "private_key",
        "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx1y2z3\nabcdEFGH1234+/==\n-----END RSA PRIVATE KEY-----\ndone",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx1y2z3\nabcdEFGH1234+/==\n-----END RSA PRIVATE KEY-----",
    ),
    (
        "private_key",
        r#"{"private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n", "x": 1}"#,
        r"-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
    ),
    ("bearer_token", "> Authorization: Bearer 8f7e6d5c4b3a29180f7e6d5c4b3a2918", "8f7e6d5c4b3a29180f7e6d5c4b3a2918"),
    ("bearer_token", r#"curl -H "authorization: bearer abc.def-ghi_jkl~mno" x"#, "abc.def-ghi_jkl~mno"),
    ("basic_auth", "Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"),
    ("url_password", "DATABASE_URL=postgres://app:s3cr3t-pw@db.internal:5432/app", "s3cr3t-pw"),
    ("password", "DB_PASSWORD=hunter2", "hunter2"),
    ("password", r#"{"password": "correct horse battery staple"}"#, "correct horse battery staple"),
    ("password", "  client_secret: 'abc123xyz'", "abc123xyz"),
    ("password", "SENTRY_API_KEY=0123456789abcdef", "0123456789abcdef"),
    ("password", "access_token: ya29.a0AfH6SMBx", "ya29.a0AfH6SMBx"),
    (
        "spillway_token",
        "token spw_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef here",
        "spw_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ),
];

/// Text with no secret in it, that looks like some: digests, UUIDs, paths, timestamps, git
/// SHAs, settings whose keys only contain the words, prose.
pub const CLEAN: &[&str] = &[
    "blake3:9f2c4e7a1b3d5f6e8c0a2b4d6f8e0c1a3b5d7f9e1c3a5b7d9f1e3c5a7b9d1f3e",
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "commit 3f9a1c2b7d4e6f8a0b1c2d3e4f5a6b7c8d9e0f1a",
    "request 550e8400-e29b-41d4-a716-446655440000 done",
    "/home/agent/.cache/pip/wheels/3f/9a/1c2b7d4e6f8a0b1c2d3e4f5a6b7c8d9e",
    "2026-12-01T10:00:00.123456Z INFO served in 12 ms",
    "password_policy=strict",
    "max_tokens=4096",
    "PWD=/home/x",
    "tokens: 1234",
    "the password is in the vault",
    "secret: ${DB_SECRET}",
    "token = null",
    "task-manager-service-deployment-7d9f8",
    "see https://example.com:8443/path?q=1",
    "kind: Secret",
    "sha512-9f2c4e7a1b3d5f6e8c0a2b4d6f8e0c1a3b5d7f9e1c3a5b7d9f1e3c5a7b9d1f3e==",
    // `ls -laR`: a directory named like a key, and the next line.
    "/usr/share/doc/python3-token:\ntotal 8",
    // Source code (`git log -p`, a diff, a file read back): types, calls, fields.
    "    token: Option<String>,",
    "fn login(user: &str, password: &str) -> Result<()> {",
    "        let token = self.token.clone();",
    "    let api_key = std::env::var(\"API_KEY\")?;",
    "    let secret = Secret::new(bytes);",
    "        password: None,",
    "    token: String,",
    "    let token = token.into();",
];

/// Every sample on a line of its own, the middle of its secret on the edge of block `i + 1`
/// (blocks of `block` bytes), with log lines between: the text, and for each sample its edge
/// and the line the edge falls in.
pub fn across_edges(block: u64) -> (String, Vec<(u64, u64)>) {
    let filler = "2026-12-02T10:00:00Z INFO nothing to see here path=/v1/items status=200\n";
    let (mut text, mut edges) = (String::new(), Vec::new());
    for (i, (_, sample, secret)) in SAMPLES.iter().enumerate() {
        let edge = (i as u64 + 1) * block;
        let at = sample.find(secret).expect("the secret is in its sample") + secret.len() / 2;
        while text.len() + at + filler.len() <= edge as usize {
            text.push_str(filler);
        }
        if let Some(pad) = (edge as usize - at - text.len()).checked_sub(1) {
            text.push_str(&" ".repeat(pad));
            text.push('\n');
        }
        let line = text.matches('\n').count() as u64 + 1;
        text.push_str(sample);
        text.push('\n');
        edges.push((edge, line));
    }
    (text, edges)
}

/// Every sample on a line of its own, after a line that shares nothing with the secrets.
pub fn text() -> String {
    SAMPLES.iter().map(|(_, text, _)| format!("-- next --\n{text}\n")).collect()
}

/// The four-character pieces of the samples' secrets that a redacted text must never show:
/// those that neither the text around the secrets nor the marks hold too.
pub fn secret_pieces() -> Vec<String> {
    let (redacted, _) = super::redact(text().as_bytes());
    let redacted = String::from_utf8(redacted).expect("the samples are text");
    let mut pieces = Vec::new();
    for (_, _, secret) in SAMPLES {
        let chars: Vec<char> = secret.chars().collect();
        pieces.extend(chars.windows(4).map(|w| w.iter().collect::<String>()).filter(|g| !redacted.contains(g)));
    }
    pieces
}

/// The first piece of a sample's secret that `shown` holds, if any.
pub fn leak(shown: &str, pieces: &[String]) -> Option<String> {
    pieces.iter().find(|g| shown.contains(g.as_str())).cloned()
}
