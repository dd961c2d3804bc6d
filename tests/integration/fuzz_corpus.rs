//! The committed fuzz corpus, replayed as regression tests on stable Rust:
//! every input must pass the same checks the fuzz targets make.

use crate::common::repo_root;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = repo_root().join("fuzz/corpus").join(target);
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        check(&std::fs::read(&path).unwrap());
        count += 1;
    }
    assert!(count > 0, "no corpus in {}", dir.display());
}

#[test]
fn config_corpus() {
    replay("config", toolgate::fuzzing::config);
}

#[test]
fn arguments_corpus() {
    replay("arguments", toolgate::fuzzing::arguments);
}

#[test]
fn convert_corpus() {
    replay("convert", toolgate::fuzzing::convert);
}
