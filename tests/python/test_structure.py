"""scripts/structure.py, the house rules CI checks, against small crates
made for each rule: each breach is found and named, and a crate that keeps
the rules passes."""

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "structure.py"


def crate(tmp_path: Path, files: dict[str, str], allow: str = "") -> subprocess.CompletedProcess:
    """A git checkout holding `files`, checked by the script."""
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    if allow:
        (tmp_path / "scripts").mkdir(exist_ok=True)
        (tmp_path / "scripts" / "structure-allow.txt").write_text(allow)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True
    )


GOOD = {
    "a/src/lib.rs": """\
        //! A crate.
        //!
        //! - [`low`]: the floor below;
        //! - `high`: the floor above.
        pub mod low;
        mod high;
        """,
    "a/src/low.rs": "//! Low.\npub fn f() {}\n",
    "a/src/high.rs": "//! High.\nuse crate::low::f;\npub fn g() { f() }\n",
    "a/floors.txt": "top: high\nbottom: low\n",
}


def test_a_crate_that_keeps_the_rules_passes(tmp_path):
    out = crate(tmp_path, GOOD)
    assert out.returncode == 0, out.stdout
    assert "0 breaches" in out.stdout


def test_a_module_its_guide_does_not_name_is_a_breach(tmp_path):
    files = dict(GOOD)
    files["a/src/lib.rs"] = files["a/src/lib.rs"] + "mod hidden;\n"
    files["a/src/hidden.rs"] = "//! Hidden.\n"
    out = crate(tmp_path, files)
    assert out.returncode == 1
    assert "a/src/lib.rs declares `mod hidden`" in out.stdout


def test_two_files_that_import_each_other_are_a_circle(tmp_path):
    files = dict(GOOD)
    del files["a/floors.txt"]  # the circle alone
    files["a/src/low.rs"] = "//! Low.\nuse crate::high::g;\npub fn f() { let _ = g; }\n"
    out = crate(tmp_path, files)
    assert out.returncode == 1
    assert "circles: a/src: high, low import each other" in out.stdout
    # A listed circle passes, and one that is gone must leave the list.
    listed = crate(tmp_path, files, allow="circle a/src: high, low\n")
    assert listed.returncode == 0, listed.stdout


def test_an_import_from_a_higher_floor_is_a_breach(tmp_path):
    files = dict(GOOD)
    files["a/src/high.rs"] = "//! High.\npub fn g() {}\n"
    files["a/src/low.rs"] = "//! Low.\nuse crate::high::g;\npub fn f() { g() }\n"
    out = crate(tmp_path, files)
    assert out.returncode == 1
    assert "floors: low (bottom, floor 1) imports high (top, floor 2), above it" in out.stdout


def test_sizes_over_the_limits_and_the_allow_list_only_shrinks(tmp_path):
    files = dict(GOOD)
    body = "\n".join(f"    let _x{i} = {i};" for i in range(120))
    files["a/src/low.rs"] = "//! Low.\npub fn f() {\n" + body + "\n}\n"
    out = crate(tmp_path, files)
    assert out.returncode == 1
    assert "function a/src/low.rs::f is 122 lines (at most 100)" in out.stdout
    assert crate(tmp_path, files, allow="122 a/src/low.rs::f\n").returncode == 0
    grew = crate(tmp_path, files, allow="110 a/src/low.rs::f\n")
    assert grew.returncode == 1 and "grew to 122 lines" in grew.stdout
    gone = crate(tmp_path, GOOD, allow="122 a/src/low.rs::f\n")
    assert gone.returncode == 1 and "fits now" in gone.stdout


def test_braces_in_strings_comments_and_chars_are_not_code(tmp_path):
    # A short function whose string runs over two lines with braces in
    # it, a raw string, a char literal, a lifetime and a block comment,
    # then one of 120 lines: only the second is over the limit.
    files = dict(GOOD)
    body = "\n".join(f"    let _x{i} = {i};" for i in range(120))
    files["a/src/low.rs"] = (
        "//! Low.\npub fn f<'a>(_s: &'a str) -> usize {\n"
        '    let m = "a descriptor \\\n        {\\"upload\\", \\"offset\\"}";\n'
        '    let r = r#"{ "#;\n    let c = \'{\';\n    /* { */\n'
        "    m.len() + r.len() + c.len_utf8()\n}\n"
        "pub fn g() {\n" + body + "\n}\n"
    )
    out = crate(tmp_path, files)
    assert out.returncode == 1
    assert "a/src/low.rs::g is 122 lines" in out.stdout, out.stdout
    assert "::f " not in out.stdout, out.stdout


def test_code_after_the_tests_module_does_not_count(tmp_path):
    files = dict(GOOD)
    body = "\n".join(f"    let _x{i} = {i};" for i in range(600))
    files["a/src/low.rs"] = (
        "//! Low.\npub fn f() {}\n#[cfg(test)]\nmod tests {\n    fn t() {\n" + body + "\n    }\n}\n"
    )
    out = crate(tmp_path, files)
    assert out.returncode == 0, out.stdout


def test_a_type_whose_methods_are_in_more_than_three_files_is_a_breach(tmp_path):
    files = {
        "a/src/lib.rs": "//! A crate.\n//!\n//! - `one`, `two`, `three`, `four`: parts.\n"
                        "mod one;\nmod two;\nmod three;\nmod four;\npub struct Job;\n",
    }
    for i, name in enumerate(["one", "two", "three", "four"]):
        files[f"a/src/{name}.rs"] = (
            f"//! Part.\nimpl crate::Job {{}}\nimpl Job {{\n    pub fn f{i}(&self) {{}}\n}}\n"
            "impl std::fmt::Debug for Job {}\n"
        )
    out = crate(tmp_path, files)
    assert out.returncode == 1
    assert "impl Job is in 4 files of a (at most 3)" in out.stdout
    # A trait's impls do not count, nor do three homes.
    three = dict(files)
    three["a/src/four.rs"] = "//! Part.\nimpl std::fmt::Debug for Job {}\n"
    assert crate(tmp_path, three).returncode == 0
    # One that was spread when the rule came in may shrink, never grow.
    assert crate(tmp_path, files, allow="homes 4 a Job\n").returncode == 0
    grew = crate(tmp_path, files, allow="homes 3 a Job\n")
    assert grew.returncode == 1 and "(at most 3)" in grew.stdout
    fits = crate(tmp_path, three, allow="homes 4 a Job\n")
    assert fits.returncode == 1 and "a Job fits now" in fits.stdout
