//! The README's example is `examples/readme.rs`, word for word: this checks
//! that the two have not drifted apart, and runs the program.

mod readme_example {
    include!("../examples/readme.rs");

    /// The example's `main`, callable from the tests below.
    pub fn run() -> spillbuffer::Result<()> {
        main()
    }
}

/// The text of the README's first ```rust block.
fn readme_rust_block() -> String {
    let readme = include_str!("../README.md");
    let start = readme
        .find("```rust\n")
        .expect("README.md has a ```rust block")
        + "```rust\n".len();
    let len = readme[start..]
        .find("```\n")
        .expect("the ```rust block is closed");
    readme[start..start + len].to_string()
}

#[test]
fn readme_example_is_examples_readme_rs() {
    assert_eq!(
        readme_rust_block(),
        include_str!("../examples/readme.rs"),
        "README.md's example and examples/readme.rs differ: copy one onto the other"
    );
}

#[test]
fn readme_example_has_no_doctest_hidden_lines() {
    for line in readme_rust_block().lines() {
        assert!(
            !(line.trim_start() == "#" || line.trim_start().starts_with("# ")),
            "a doctest-hidden line shows as text on a Markdown viewer: {line}"
        );
    }
}

#[test]
fn readme_example_runs() {
    readme_example::run().expect("the README example succeeds");
}
