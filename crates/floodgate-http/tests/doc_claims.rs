mod common;
#[test]
fn placeholder() { let _ = common::Hello; }
