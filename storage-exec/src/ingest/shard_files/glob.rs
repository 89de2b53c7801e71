//! [`matches`]: a file or object name against a shell pattern of its last
//! part (`train-*.tar`, `s-??.tfrecord`, `s-[0-4].tar`), as a shell
//! would match it; for local shard globs and an object store's.
//!
//! The pattern is the user's: it is matched in time proportional to its
//! length times the name's, never by backtracking (`*a*a*a*b` against a
//! long name of `a`s stays quick).

/// One step of a pattern.
#[derive(Debug, PartialEq)]
enum Step {
    /// `*`: any run of characters.
    Any,
    /// `?`: one character.
    One,
    /// `[...]`: one character of these ranges (a lone one is `c-c`).
    Set(Vec<(char, char)>),
    /// That character.
    Is(char),
}

/// The steps of `pattern`; a `[` with no `]` after it is itself.
fn steps(pattern: &[char]) -> Vec<Step> {
    let mut out = Vec::with_capacity(pattern.len());
    let mut i = 0;
    while i < pattern.len() {
        let c = pattern[i];
        i += 1;
        match c {
            '*' if out.last() == Some(&Step::Any) => {}
            '*' => out.push(Step::Any),
            '?' => out.push(Step::One),
            '[' => match pattern[i..].iter().position(|&c| c == ']') {
                Some(close) => {
                    let set = &pattern[i..i + close];
                    let mut ranges = Vec::new();
                    let mut j = 0;
                    while j < set.len() {
                        if j + 2 < set.len() && set[j + 1] == '-' {
                            ranges.push((set[j], set[j + 2]));
                            j += 3;
                        } else {
                            ranges.push((set[j], set[j]));
                            j += 1;
                        }
                    }
                    out.push(Step::Set(ranges));
                    i += close + 1;
                }
                None => out.push(Step::Is('[')),
            },
            c => out.push(Step::Is(c)),
        }
    }
    out
}

/// Whether `name` matches `pattern` (`*` any run, `?` one character,
/// `[abc]` / `[a-z]` one of a set).
pub(crate) fn matches(pattern: &[char], name: &[char]) -> bool {
    // `at[j]`: whether the steps so far can end just before name[j].
    let mut at = vec![false; name.len() + 1];
    at[0] = true;
    for step in steps(pattern) {
        let mut next = vec![false; name.len() + 1];
        match step {
            Step::Any => {
                let mut reached = false;
                for j in 0..=name.len() {
                    reached |= at[j];
                    next[j] = reached;
                }
            }
            one => {
                for j in 0..name.len() {
                    let c = name[j];
                    let fits = match &one {
                        Step::One => true,
                        Step::Set(ranges) => ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi),
                        Step::Is(p) => *p == c,
                        Step::Any => unreachable!("matched above"),
                    };
                    next[j + 1] = at[j] && fits;
                }
            }
        }
        at = next;
    }
    at[name.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, n: &str) -> bool {
        matches(
            &p.chars().collect::<Vec<_>>(),
            &n.chars().collect::<Vec<_>>(),
        )
    }

    #[test]
    fn globs_match_as_a_shell_would() {
        assert!(m("train-*.tar", "train-000.tar"));
        assert!(!m("train-*.tar", "val-000.tar"));
        assert!(m("s-??.tfrecord", "s-01.tfrecord"));
        assert!(!m("s-??.tfrecord", "s-1.tfrecord"));
        assert!(m("s-[0-4].tar", "s-3.tar") && !m("s-[0-4].tar", "s-7.tar"));
        assert!(m("s-[ab0-2].tar", "s-b.tar") && m("s-[ab0-2].tar", "s-1.tar"));
        assert!(m("*", "anything") && m("*", "") && !m("?", ""));
        assert!(m("a[b", "a[b"), "a lone [ is itself");
        assert!(m("**x*", "abx") && !m("*x*y", "abx"));
        assert!(m("été-*.tar", "été-1.tar"));
    }

    #[test]
    fn a_pattern_of_many_stars_against_a_long_name_is_quick() {
        let name = "a".repeat(5_000);
        let began = std::time::Instant::now();
        assert!(!m("*a*a*a*a*a*a*a*a*b", &name));
        assert!(m("*a*a*a*a*a*a*a*a*", &name));
        // Backtracking would take longer than the machine's lifetime.
        assert!(began.elapsed() < std::time::Duration::from_secs(5));
    }
}
