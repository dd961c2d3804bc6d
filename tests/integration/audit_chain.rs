//! The audit trail's hash chain, with the real binary: `toolgate serve`
//! writes calls and refusals into one chain; `toolgate audit verify`
//! passes it intact, names the record that was edited, removed or moved,
//! follows the chain across a rotation (mv + SIGHUP) and a restart, and
//! finds a rotated file missing between two.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

const TOKEN: &str = "chain-token-1";

/// A `toolgate serve` process writing its audit trail to `path`.
struct Served {
    child: ChildGuard,
    port: u16,
    log: PathBuf,
}

fn serve(dir: &Path, path: &Path, url: &str) -> Served {
    let port = free_port();
    let config = dir.join("toolgate.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\naudit:\n  path: \"{}\"\ntenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n      - name: t\n        url: \"{url}\"\n",
            path.display()
        ),
    )
    .unwrap();
    let log = dir.join(format!("toolgate-{port}.log"));
    let child = serve_binary(&config, &log, &[("POD_NAME", "gw-chain-0")]);
    Served { child, port, log }
}

/// `count` calls of `t__echo`, and one call with a wrong token (a refusal).
async fn traffic(port: u16, count: usize) {
    wait_for_port(port).await;
    let mut client = client_at(port).await;
    wait_listed(&mut client, TOKEN, "t__echo").await;
    for i in 0..count {
        invoke(
            &mut client,
            TOKEN,
            "t__echo",
            &format!("{{\"text\": \"{i}\"}}"),
        )
        .await
        .unwrap();
    }
    let refused = invoke(&mut client, "not-a-token", "t__echo", "{}").await;
    assert!(refused.is_err());
}

/// Waits (bounded) until `path` has `count` lines.
async fn lines_in(path: &Path, count: usize) -> Vec<String> {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= count {
            return lines;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} has {} lines, not {count}",
            path.display(),
            lines.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `toolgate audit verify FILES`: exit code, stdout, stderr.
fn verify(files: &[&Path]) -> (i32, String, String) {
    let output = std::process::Command::new(toolgate_bin())
        .args(["audit", "verify"])
        .args(files)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn record(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// Writes `lines` to a copy named `name` in `dir`.
fn copy_with(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn kill_hup(child: &ChildGuard) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

#[tokio::test]
async fn verify_passes_a_clean_chain_and_names_the_record_edited_removed_or_moved() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let served = serve(dir.path(), &path, &server.url);
    traffic(served.port, 5).await;
    let lines = lines_in(&path, 6).await;
    drop(served);

    // Calls and the refusal in one chain: seq 1.., each linked to the line
    // before, the first marked.
    let records: Vec<Value> = lines.iter().map(|line| record(line)).collect();
    assert_eq!(records[0]["v"], 8);
    assert_eq!(records[0]["chain"]["reason"], "start");
    assert!(records[0].get("prev").is_none(), "{}", lines[0]);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record["seq"], i as u64 + 1, "{record}");
    }
    assert!(records.iter().any(|r| r["kind"] == "refusal"));
    assert!(records.iter().any(|r| r["kind"] == "call"));
    let (code, out, err) = verify(&[&path]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("intact: {} records in 1 files", lines.len())),
        "{out}"
    );
    assert!(out.contains("(starts: start, unlinked)"), "{out}");

    // One record edited (its outcome): named by its line and seq.
    let mut edited = lines.clone();
    edited[2] = edited[2].replacen("\"outcome\":\"ok\"", "\"outcome\":\"refused\"", 1);
    assert_ne!(edited[2], lines[2]);
    let file = copy_with(dir.path(), "edited.jsonl", &edited);
    let (code, out, err) = verify(&[&file]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!("{}:3 (seq 3): edited", file.display())),
        "{err}"
    );

    // One record removed: the next one names what is missing.
    let mut removed = lines.clone();
    removed.remove(3);
    let file = copy_with(dir.path(), "removed.jsonl", &removed);
    let (code, out, err) = verify(&[&file]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!(
            "{}:4 (seq 5): seq 5 follows seq 3: seq 4 is missing",
            file.display()
        )),
        "{err}"
    );

    // Two records swapped.
    let mut swapped = lines.clone();
    swapped.swap(2, 3);
    let file = copy_with(dir.path(), "swapped.jsonl", &swapped);
    let (code, out, err) = verify(&[&file]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!(
            "{}:3 (seq 4): seq 4 follows seq 2",
            file.display()
        )),
        "{err}"
    );

    // The first record cut off.
    let file = copy_with(dir.path(), "cut.jsonl", &lines[1..]);
    let (code, _, err) = verify(&[&file]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(":1 (seq 2): the file's first record has no `chain` mark"),
        "{err}"
    );

    // Records without `seq` put before the first record (which starts a
    // chain anew, linking to nothing): a break, not a note.
    let forged = r#"{"v":5,"time":"2025-06-01T00:00:00.000Z","kind":"call","rpc":"InvokeTool","tenant":"acme","tool":"t__echo","outcome":"ok"}"#;
    let mut prefixed = vec![forged.to_owned(), forged.replace("00.000Z", "01.000Z")];
    prefixed.extend(lines.iter().cloned());
    let file = copy_with(dir.path(), "forged.jsonl", &prefixed);
    let (code, out, err) = verify(&[&file]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!(
            "{}:3 (seq 1): starts a chain without `prev` after 2 records without `seq`",
            file.display()
        )),
        "{err}"
    );
    // One without `seq` claiming this schema.
    let mut prefixed = vec![forged.replace("\"v\":5", "\"v\":7")];
    prefixed.extend(lines.iter().cloned());
    let file = copy_with(dir.path(), "forged7.jsonl", &prefixed);
    let (code, out, err) = verify(&[&file]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!(
            "{}:1: no `seq` in a record of schema 7",
            file.display()
        )),
        "{err}"
    );

    // A file that cannot be read.
    let (code, _, err) = verify(&[&dir.path().join("absent.jsonl")]);
    assert_eq!(code, 66, "{err}");
    assert!(err.contains("absent.jsonl: cannot be read"), "{err}");
}

#[tokio::test]
async fn one_chain_runs_across_rotations_and_a_restart() {
    let server = serve_mcp(TestServer::new(&["echo"])).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let served = serve(dir.path(), &path, &server.url);
    traffic(served.port, 2).await;
    let first = lines_in(&path, 3).await;

    // Rotation: mv, then SIGHUP; the new file's first record links to the
    // last record of the moved one.
    let rotated_2 = dir.path().join("audit.jsonl.2");
    std::fs::rename(&path, &rotated_2).unwrap();
    kill_hup(&served.child);
    // SIGHUP opens the path at once.
    let started = Instant::now();
    while !path.exists() {
        assert!(started.elapsed() < Duration::from_secs(10), "not reopened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    traffic(served.port, 2).await;
    let second = lines_in(&path, 3).await;
    let head = record(&second[0]);
    assert_eq!(head["chain"]["reason"], "hangup", "{head}");
    assert_eq!(head["seq"], record(&first[2])["seq"].as_u64().unwrap() + 1);

    // Moved without a signal: found before the next batch.
    let rotated_1 = dir.path().join("audit.jsonl.1");
    std::fs::rename(&path, &rotated_1).unwrap();
    traffic(served.port, 1).await;
    let third = lines_in(&path, 2).await;
    assert_eq!(record(&third[0])["chain"]["reason"], "moved");

    // A restart: the new process appends to the file and goes on from its
    // last record.
    let Served { mut child, log, .. } = served;
    signal(child.0.id(), "TERM");
    wait_exit(&mut child.0, Duration::from_secs(30)).await;
    let served = serve(dir.path(), &path, &server.url);
    traffic(served.port, 1).await;
    let fourth = lines_in(&path, 4).await;
    let resumed = record(&fourth[2]);
    assert_eq!(resumed["chain"]["reason"], "resume", "{resumed}");
    assert_eq!(
        resumed["seq"],
        record(&fourth[1])["seq"].as_u64().unwrap() + 1
    );
    // The writer logs where the chain stands at each file it opens.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("audit chain: destination opened"),
        "{logged}"
    );

    let (code, out, err) = verify(&[&rotated_2, &rotated_1, &path]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("intact: 10 records in 3 files"), "{out}");
    assert!(out.contains("(starts: hangup, linked)"), "{out}");
    assert!(out.contains("(starts: moved, linked)"), "{out}");

    // The middle file missing: the newest file's first record names the
    // records between.
    let (code, out, err) = verify(&[&rotated_2, &path]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!(
            "{}:1 (seq 7): seq 7 follows seq 3: seqs 4 to 6 are missing",
            path.display()
        )),
        "{err}"
    );
    // Files out of order: the oldest one's unlinked start passes, the
    // newest one does not follow it.
    let (code, _, err) = verify(&[&rotated_1, &rotated_2, &path]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "{}:1 (seq 7): seq 7 follows seq 3",
            path.display()
        )),
        "{err}"
    );
    drop(served);
}
