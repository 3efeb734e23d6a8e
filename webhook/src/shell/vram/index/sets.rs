//! The set evaluation of a placement (see the index's complexity): bit sets over node slots, each
//! requirement narrowing a term's nodes through the inverted index.

use super::{Compiled, CompiledPlacement, VramIndex, slot_id};
use crate::policy::basis::Basis;

/// A set of node slots.
#[derive(Debug, Clone)]
pub(super) struct Bits(Vec<u64>);

impl Bits {
    pub(super) fn zeros(len: usize) -> Self {
        Self(vec![0; len.div_ceil(64)])
    }

    fn clear(&mut self) {
        self.0.fill(0);
    }

    fn set(&mut self, slot: u32) {
        if let Some(w) = self.0.get_mut(slot as usize / 64) {
            *w |= 1 << (slot % 64);
        }
    }

    fn unset(&mut self, slot: u32) {
        if let Some(w) = self.0.get_mut(slot as usize / 64) {
            *w &= !(1 << (slot % 64));
        }
    }

    fn and(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a &= *b;
        }
    }

    fn and_not(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a &= !*b;
        }
    }

    fn or(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= *b;
        }
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    fn ones(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros() as usize;
                w &= w - 1;
                Some(i * 64 + bit)
            })
        })
    }
}

impl Compiled {
    /// Narrow `acc` (the nodes still in the term) to those satisfying this requirement; `tmp` is
    /// scratch of the same length.
    fn narrow(&self, index: &VramIndex, acc: &mut Bits, tmp: &mut Bits) {
        match self {
            Self::In(k, vs) => {
                tmp.clear();
                index.union_values(*k, vs, tmp);
                acc.and(tmp);
            }
            Self::NotIn(k, vs) => {
                tmp.clear();
                index.union_values(*k, vs, tmp);
                acc.and_not(tmp);
            }
            Self::Exists(k) => {
                tmp.clear();
                index.union_key(*k, |_| true, tmp);
                acc.and(tmp);
            }
            Self::DoesNotExist(k) => {
                tmp.clear();
                index.union_key(*k, |_| true, tmp);
                acc.and_not(tmp);
            }
            Self::Gt(k, x) => {
                tmp.clear();
                index.union_key(*k, |v| index.syms.int(v).is_some_and(|n| n > *x), tmp);
                acc.and(tmp);
            }
            Self::Lt(k, x) => {
                tmp.clear();
                index.union_key(*k, |v| index.syms.int(v).is_some_and(|n| n < *x), tmp);
                acc.and(tmp);
            }
            Self::NameIn(slots) => {
                tmp.clear();
                for &s in slots {
                    tmp.set(s);
                }
                acc.and(tmp);
            }
            Self::NameNotIn(slots) => {
                for &s in slots {
                    acc.unset(s);
                }
            }
            Self::Never => acc.clear(),
        }
    }
}

impl VramIndex {
    /// The placement as sets of nodes (see the module's complexity), then the smallest GPU among
    /// them.
    pub(super) fn evaluate_sets(&self, p: &CompiledPlacement) -> Option<Basis> {
        let len = self.slots.len();
        let mut base = Bits::zeros(len);
        let mut tmp = Bits::zeros(len);
        match p.selector.split_first() {
            None => {
                for &(_, slot) in &self.by_memory {
                    base.set(slot_id(slot));
                }
            }
            Some((&(k, v), rest)) => {
                self.union_values(Some(k), &[v], &mut base);
                for &(k, v) in rest {
                    tmp.clear();
                    self.union_values(Some(k), &[v], &mut tmp);
                    base.and(&tmp);
                }
            }
        }
        let found = match &p.terms {
            None => base,
            Some(terms) => {
                let mut any = Bits::zeros(len);
                let mut acc = Bits::zeros(len);
                for term in terms {
                    acc.0.copy_from_slice(&base.0);
                    for r in term {
                        if acc.is_empty() {
                            break;
                        }
                        r.narrow(self, &mut acc, &mut tmp);
                    }
                    any.or(&acc);
                }
                any
            }
        };
        found
            .ones()
            .filter_map(|slot| self.slots.get(slot)?.as_ref()?.mib)
            .min()
            .map(|mib| Basis { mib })
    }

    /// Add to `out` the nodes whose label `key` is one of `values`.
    fn union_values(&self, key: Option<u32>, values: &[u32], out: &mut Bits) {
        let Some(by_value) = key.and_then(|k| self.postings.get(&k)) else {
            return;
        };
        for v in values {
            for &slot in by_value.get(v).into_iter().flatten() {
                out.set(slot);
            }
        }
    }

    /// Add to `out` the nodes carrying label `key` with a value `keep` accepts.
    fn union_key(&self, key: Option<u32>, keep: impl Fn(u32) -> bool, out: &mut Bits) {
        let Some(by_value) = key.and_then(|k| self.postings.get(&k)) else {
            return;
        };
        for (&v, slots) in by_value {
            if keep(v) {
                for &slot in slots {
                    out.set(slot);
                }
            }
        }
    }
}
