//! tests/lab/suite reruns a test whose panic message starts with the prefix
//! that tests/support/margin.rs gives every timing judgment: the two must
//! agree, or a statistical failure would never be rerun.

pub mod support {
    pub mod margin;
}

#[test]
fn the_suite_reruns_on_margins_prefix() {
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab/suite")).unwrap();
    let pattern = format!("[[ $msg == \"{}\"* ]]", support::margin::STATISTICAL);
    assert!(script.contains(&pattern), "tests/lab/suite does not test for {pattern}");
}
