//! Which part goes where: a pure function of a dataset's [`PartLayout`] and
//! the storage nodes, kept apart from the moving of bytes so that it can
//! be checked on its own.
//!
//! - [`away`]: nodes leave (lost past their time, or drained). Each part
//!   keeps its holders that stay and gets, for each one that leaves, a
//!   node that holds no copy of it yet — the least loaded first (parts
//!   held, counting those just given), ties by the nodes' order. The
//!   bytes come from a holder that stays, else from the leaving node
//!   itself if it still answers (a drain). A part nobody can be read from,
//!   or with too few nodes left to take it, is reported [`Short`], and
//!   keeps naming the holders not replaced: their copies may come back.
//! - [`spread`]: a node joins. Parts move from the most loaded node to
//!   the least loaded that holds no copy, one at a time, until no two
//!   nodes differ by more than one part; each move also drops the part
//!   from the node it left.
//!
//! Parts whose holders that stay are the same nodes get the same new
//! holders: a sample's part is known only by the nodes it is found on
//! (`super`), so two such parts must be moved alike.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::replicas::ledger::PartLayout;

/// One part copied from one node to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Move {
    /// The part.
    pub part: usize,
    /// The node its rows are read from.
    pub from: String,
    /// The node that gets a copy.
    pub to: String,
}

/// A part left with fewer copies than the layout's replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Short {
    /// The part.
    pub part: usize,
    /// Its holders after the moves.
    pub holders: Vec<String>,
    /// Why it is short.
    pub why: String,
}

/// What a plan does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The copies to make.
    pub moves: Vec<Move>,
    /// Parts a node stops holding: `(part, node)`.
    pub drops: Vec<(usize, String)>,
    /// Each part's holders once done.
    pub holders: Vec<Vec<String>>,
    /// Parts that stay short.
    pub short: Vec<Short>,
}

/// Parts held by each of `nodes` under `holders`.
fn loads(holders: &[Vec<String>], nodes: &[String]) -> BTreeMap<String, usize> {
    let mut load: BTreeMap<String, usize> = nodes.iter().map(|n| (n.clone(), 0)).collect();
    for h in holders.iter().flatten() {
        if let Some(l) = load.get_mut(h) {
            *l += 1;
        }
    }
    load
}

/// Moves `leaving`'s parts to `nodes` (the nodes that may take parts:
/// live and staying, in a stable order); `readable(node)` says whether a
/// node can be read now (see the module docs).
pub fn away(
    layout: &PartLayout,
    leaving: &[String],
    nodes: &[String],
    readable: &dyn Fn(&str) -> bool,
) -> Plan {
    let r = layout.replicas as usize;
    let stays = |h: &String| !leaving.contains(h);
    let mut plan = Plan {
        holders: layout
            .holders
            .iter()
            .map(|h| h.iter().filter(|n| stays(n)).cloned().collect())
            .collect(),
        ..Plan::default()
    };
    let mut load = loads(&plan.holders, nodes);
    let mut given: HashMap<Vec<String>, Vec<String>> = HashMap::new();
    for (part, was) in layout.holders.iter().enumerate() {
        let stay: Vec<String> = plan.holders[part].clone();
        let need = r.saturating_sub(stay.len());
        if need == 0 {
            continue;
        }
        let from = stay
            .iter()
            .chain(was.iter().filter(|n| !stays(n)))
            .find(|n| readable(n))
            .cloned();
        let Some(from) = from else {
            // Where its only copies are is not forgotten: they may come back.
            plan.holders[part] = was.clone();
            plan.short.push(Short {
                part,
                holders: was.clone(),
                why: format!("no holder of it answers ({})", was.join(", ")),
            });
            continue;
        };
        let mut key = stay.clone();
        key.sort();
        let to = given
            .entry(key)
            .or_insert_with(|| {
                let mut free: Vec<&String> = nodes
                    .iter()
                    .filter(|n| !was.contains(n) && stays(n))
                    .collect();
                free.sort_by_key(|n| load[*n]);
                free.into_iter().take(need).cloned().collect()
            })
            .clone();
        for t in &to {
            *load.get_mut(t).expect("a node of `nodes`") += 1;
            plan.moves.push(Move {
                part,
                from: from.clone(),
                to: t.clone(),
            });
            plan.holders[part].push(t.clone());
        }
        if to.len() < need {
            // The leaving holders not replaced stay named: their copies
            // may come back, and are not retired meanwhile.
            let kept = was.iter().filter(|n| !stays(n)).take(need - to.len());
            plan.holders[part].extend(kept.cloned());
            plan.short.push(Short {
                part,
                holders: plan.holders[part].clone(),
                why: format!(
                    "only {} node(s) without a copy of it answer; it needs {need}",
                    to.len()
                ),
            });
        }
    }
    plan
}

/// Moves parts onto the least loaded of `nodes` (a node that joined)
/// until the load is even (see the module docs).
pub fn spread(layout: &PartLayout, nodes: &[String]) -> Plan {
    let mut plan = Plan {
        holders: layout.holders.clone(),
        ..Plan::default()
    };
    let bound = layout.holders.len() * layout.replicas as usize;
    for _ in 0..bound {
        let load = loads(&plan.holders, nodes);
        let Some((light, low)) = load.iter().min_by_key(|(n, l)| (**l, *n)) else {
            break;
        };
        // The most loaded node with a part the light one lacks.
        let mut heavy: Vec<(&String, &usize)> =
            load.iter().filter(|(_, l)| **l > low + 1).collect();
        heavy.sort_by_key(|(n, l)| (std::cmp::Reverse(**l), *n));
        let found = heavy.iter().find_map(|(h, _)| {
            plan.holders
                .iter()
                .position(|hs| hs.contains(h) && !hs.contains(light))
                .map(|p| ((*h).clone(), p))
        });
        let Some((from, part)) = found else {
            break;
        };
        let light = light.clone();
        let slot = plan.holders[part]
            .iter()
            .position(|n| *n == from)
            .expect("the part's holder");
        plan.holders[part][slot] = light.clone();
        plan.moves.push(Move {
            part,
            from: from.clone(),
            to: light,
        });
        plan.drops.push((part, from));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(holders: &[&[&str]], r: u32) -> PartLayout {
        PartLayout {
            replicas: r,
            holders: holders
                .iter()
                .map(|h| h.iter().map(|s| s.to_string()).collect())
                .collect(),
            versions: Default::default(),
        }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_lost_nodes_parts_go_to_nodes_without_a_copy_from_a_holder_that_stays() {
        let l = layout(&[&["a", "b"], &["b", "c"], &["c", "a"]], 2);
        let plan = away(&l, &names(&["a"]), &names(&["b", "c"]), &|n| n != "a");
        assert_eq!(
            plan.moves,
            [
                Move {
                    part: 0,
                    from: "b".into(),
                    to: "c".into()
                },
                Move {
                    part: 2,
                    from: "c".into(),
                    to: "b".into()
                }
            ]
        );
        assert_eq!(
            plan.holders,
            [names(&["b", "c"]), names(&["b", "c"]), names(&["c", "b"])]
        );
        assert!(plan.short.is_empty() && plan.drops.is_empty());
        // With a fourth node, the parts go to it: it holds none.
        let plan = away(&l, &names(&["a"]), &names(&["b", "c", "d"]), &|n| n != "a");
        assert!(plan.moves.iter().all(|m| m.to == "d"), "{:?}", plan.moves);
    }

    #[test]
    fn a_drain_reads_the_leaving_node_when_it_is_the_only_copy() {
        let l = layout(&[&["a"], &["b"]], 1);
        let plan = away(&l, &names(&["a"]), &names(&["b"]), &|_| true);
        assert_eq!(
            plan.moves,
            [Move {
                part: 0,
                from: "a".into(),
                to: "b".into()
            }]
        );
        // Lost instead: nobody has it.
        let plan = away(&l, &names(&["a"]), &names(&["b"]), &|n| n != "a");
        assert!(plan.moves.is_empty());
        assert_eq!(plan.short.len(), 1);
        assert!(plan.short[0].why.contains("no holder"), "{:?}", plan.short);
    }

    #[test]
    fn too_few_nodes_leave_a_part_short_and_named() {
        let l = layout(&[&["a", "b"], &["b", "a"]], 2);
        let plan = away(&l, &names(&["a"]), &names(&["b"]), &|n| n != "a");
        assert!(plan.moves.is_empty());
        assert_eq!(plan.short.len(), 2);
        assert!(plan.short[0].why.contains("it needs 1"), "{:?}", plan.short);
        // a is still named: its copies may come back, and are not retired.
        for (after, before) in plan.holders.iter().zip(&l.holders) {
            let (mut x, mut y) = (after.clone(), before.clone());
            x.sort();
            y.sort();
            assert_eq!(x, y);
        }
    }

    #[test]
    fn parts_with_the_same_staying_holders_move_alike() {
        // a and d leave; parts 0 and 3 both keep only b... and c.
        let l = layout(&[&["a", "b"], &["b", "c"], &["c", "d"], &["d", "b"]], 2);
        let plan = away(&l, &names(&["a", "d"]), &names(&["b", "c", "e"]), &|_| true);
        let to = |p: usize| -> Vec<&str> {
            plan.moves
                .iter()
                .filter(|m| m.part == p)
                .map(|m| m.to.as_str())
                .collect()
        };
        assert_eq!(to(0), to(3));
        for h in &plan.holders {
            assert_eq!(h.len(), 2, "{:?}", plan.holders);
            assert!(!h.contains(&"a".to_string()) && !h.contains(&"d".to_string()));
        }
    }

    #[test]
    fn a_node_that_joins_takes_an_even_share() {
        let l = layout(&[&["a", "b"], &["b", "c"], &["c", "a"]], 2);
        let plan = spread(&l, &names(&["a", "b", "c", "d"]));
        let load = loads(&plan.holders, &names(&["a", "b", "c", "d"]));
        assert!(load.values().all(|&n| (1..=2).contains(&n)), "{load:?}");
        assert_eq!(load["d"], 1);
        assert_eq!(plan.moves.len(), plan.drops.len());
        for h in &plan.holders {
            let mut d = h.clone();
            d.dedup();
            assert_eq!(d.len(), 2, "two distinct holders: {h:?}");
        }
        // Already even: nothing moves.
        assert!(spread(&l, &names(&["a", "b", "c"])).moves.is_empty());
    }
}
