//! Sets of host CPU ids, in the kernel's list syntax (`0-3,8,10-11`).
//!
//! A [`CpuSet`] is what a placement gives each vCPU thread and what
//! `sched_setaffinity` takes. Most sets the engine produces are a single CPU or a
//! contiguous range, so those are stored inline (no heap allocation); only
//! irregular sets use a bitmap. The representation is canonical, so derived
//! equality and hashing compare sets, not encodings.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Largest CPU id accepted when parsing. Linux's NR_CPUS tops out at 8192 on
/// the largest distribution kernels; 65535 leaves room while keeping a
/// malformed list such as `0-4000000000` from allocating gigabytes.
pub const MAX_CPU_ID: u32 = 65_535;

/// Errors from parsing a CPU list.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CpuSetError {
    /// The list was empty (or only whitespace).
    #[error("empty CPU list")]
    Empty,
    /// An element was not a number or a `lo-hi` range.
    #[error("invalid CPU list element {0:?}: expected N or N-M")]
    BadElement(String),
    /// A range ran backwards (`5-3`).
    #[error("invalid CPU range {lo}-{hi}: start is after end")]
    Backwards {
        /// Start of the range.
        lo: u32,
        /// End of the range.
        hi: u32,
    },
    /// A CPU id above [`MAX_CPU_ID`].
    #[error("CPU id {0} is above the supported maximum {MAX_CPU_ID}")]
    TooLarge(u64),
}

/// A set of host CPU ids.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct CpuSet {
    repr: Repr,
}

/// Canonical encodings: `Range` whenever the set is empty or contiguous,
/// `Bits` otherwise (with no trailing zero words).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    /// `first..first + len`; `len == 0` is the empty set (with `first == 0`).
    Range { first: u32, len: u32 },
    /// Bitmap, bit `i` of word `w` = CPU `64 * w + i` (boxed slice: keeps
    /// `CpuSet` at 24 bytes, it sits in every assignment).
    Bits(Box<[u64]>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Range { first: 0, len: 0 }
    }
}

impl CpuSet {
    /// The empty set.
    pub const fn new() -> Self {
        CpuSet {
            repr: Repr::Range { first: 0, len: 0 },
        }
    }

    /// A set holding exactly `cpu`. Never allocates.
    pub const fn single(cpu: u32) -> Self {
        CpuSet {
            repr: Repr::Range { first: cpu, len: 1 },
        }
    }

    /// The CPUs `first..=last`; empty when `last < first`. Never allocates.
    pub fn range(first: u32, last: u32) -> Self {
        if last < first {
            return CpuSet::new();
        }
        CpuSet {
            repr: Repr::Range {
                first,
                len: last - first + 1,
            },
        }
    }

    /// Number of CPUs in the set.
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Range { len, .. } => *len as usize,
            Repr::Bits(words) => words.iter().map(|w| w.count_ones() as usize).sum(),
        }
    }

    /// True when the set holds no CPU.
    pub fn is_empty(&self) -> bool {
        matches!(self.repr, Repr::Range { len: 0, .. })
    }

    /// True when `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        match &self.repr {
            Repr::Range { first, len } => cpu >= *first && cpu - *first < *len,
            Repr::Bits(words) => words
                .get((cpu / 64) as usize)
                .is_some_and(|w| w & (1u64 << (cpu % 64)) != 0),
        }
    }

    /// Lowest CPU id in the set.
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// Highest CPU id in the set.
    pub fn last(&self) -> Option<u32> {
        match &self.repr {
            Repr::Range { len: 0, .. } => None,
            Repr::Range { first, len } => Some(first + len - 1),
            Repr::Bits(words) => words
                .iter()
                .enumerate()
                .rev()
                .find(|(_, w)| **w != 0)
                .map(|(i, w)| word_base(i) + 63 - w.leading_zeros()),
        }
    }

    /// Ascending iterator over the CPU ids.
    pub fn iter(&self) -> CpuSetIter<'_> {
        match &self.repr {
            Repr::Range { first, len } => CpuSetIter::Range {
                next: *first as u64,
                end: *first as u64 + *len as u64,
            },
            Repr::Bits(words) => CpuSetIter::Bits {
                words,
                word: 0,
                bits: words.first().copied().unwrap_or(0),
            },
        }
    }

    /// Adds `cpu` to the set.
    pub fn insert(&mut self, cpu: u32) {
        if self.contains(cpu) {
            return;
        }
        if let Repr::Range { first, len } = &mut self.repr {
            if *len == 0 {
                *first = cpu;
                *len = 1;
                return;
            }
            if cpu.checked_add(1) == Some(*first) {
                *first = cpu;
                *len += 1;
                return;
            }
            if u64::from(cpu) == u64::from(*first) + u64::from(*len) {
                *len += 1;
                return;
            }
        }
        let mut words = self.to_words();
        set_bit(&mut words, cpu);
        *self = CpuSet::from_words(words);
    }

    /// Removes `cpu` from the set.
    pub fn remove(&mut self, cpu: u32) {
        if !self.contains(cpu) {
            return;
        }
        let mut words = self.to_words();
        words[(cpu / 64) as usize] &= !(1u64 << (cpu % 64));
        *self = CpuSet::from_words(words);
    }

    /// CPUs in either set.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let mut a = self.to_words();
        let b = other.to_words();
        if a.len() < b.len() {
            a.resize(b.len(), 0);
        }
        for (x, y) in a.iter_mut().zip(b.iter()) {
            *x |= *y;
        }
        CpuSet::from_words(a)
    }

    /// CPUs in both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let mut a = self.to_words();
        let b = other.to_words();
        a.truncate(b.len());
        for (x, y) in a.iter_mut().zip(b.iter()) {
            *x &= *y;
        }
        CpuSet::from_words(a)
    }

    /// CPUs in `self` but not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        let mut a = self.to_words();
        let b = other.to_words();
        for (x, y) in a.iter_mut().zip(b.iter()) {
            *x &= !*y;
        }
        CpuSet::from_words(a)
    }

    /// True when every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.iter().all(|c| other.contains(c))
    }

    fn to_words(&self) -> Vec<u64> {
        match &self.repr {
            Repr::Bits(words) => words.to_vec(),
            Repr::Range { len: 0, .. } => Vec::new(),
            Repr::Range { first, len } => {
                let last = first + (len - 1);
                let mut words = vec![0u64; (last / 64) as usize + 1];
                for cpu in *first..=last {
                    set_bit(&mut words, cpu);
                }
                words
            }
        }
    }

    /// Builds the canonical form of a bitmap.
    fn from_words(mut words: Vec<u64>) -> CpuSet {
        while words.last() == Some(&0) {
            words.pop();
        }
        let total: u32 = words.iter().map(|w| w.count_ones()).sum();
        if total == 0 {
            return CpuSet::new();
        }
        let first = words
            .iter()
            .enumerate()
            .find(|(_, w)| **w != 0)
            .map(|(i, w)| word_base(i) + w.trailing_zeros())
            .unwrap_or(0);
        let last = word_base(words.len() - 1) + 63 - words.last().map_or(0, |w| w.leading_zeros());
        if last - first + 1 == total {
            return CpuSet {
                repr: Repr::Range { first, len: total },
            };
        }
        CpuSet {
            repr: Repr::Bits(words.into_boxed_slice()),
        }
    }
}

/// The first CPU of bitmap word `index`.
// A bitmap holds u32 CPU ids, 64 a word: its word indices are below 2^26.
#[allow(clippy::cast_possible_truncation)]
fn word_base(index: usize) -> u32 {
    index as u32 * 64
}

fn set_bit(words: &mut Vec<u64>, cpu: u32) {
    let w = (cpu / 64) as usize;
    if words.len() <= w {
        words.resize(w + 1, 0);
    }
    words[w] |= 1u64 << (cpu % 64);
}

/// Ascending iterator over a [`CpuSet`].
pub enum CpuSetIter<'a> {
    /// Iterating a contiguous range.
    #[doc(hidden)]
    Range {
        /// Next CPU to yield.
        next: u64,
        /// One past the last CPU.
        end: u64,
    },
    /// Iterating a bitmap.
    #[doc(hidden)]
    Bits {
        /// All words.
        words: &'a [u64],
        /// Index of the word in `bits`.
        word: usize,
        /// Remaining bits of the current word.
        bits: u64,
    },
}

impl Iterator for CpuSetIter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        match self {
            CpuSetIter::Range { next, end } => {
                if *next < *end {
                    // Below `end`, one past a u32 CPU id.
                    let cpu = u32::try_from(*next).ok()?;
                    *next += 1;
                    Some(cpu)
                } else {
                    None
                }
            }
            CpuSetIter::Bits { words, word, bits } => loop {
                if *bits != 0 {
                    let bit = bits.trailing_zeros();
                    *bits &= *bits - 1;
                    return Some(word_base(*word) + bit);
                }
                *word += 1;
                *bits = *words.get(*word)?;
            },
        }
    }
}

impl<'a> IntoIterator for &'a CpuSet {
    type Item = u32;
    type IntoIter = CpuSetIter<'a>;
    fn into_iter(self) -> CpuSetIter<'a> {
        self.iter()
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut words = Vec::new();
        for cpu in iter {
            set_bit(&mut words, cpu);
        }
        CpuSet::from_words(words)
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetError;

    /// Parses the kernel's list syntax: comma-separated `N` or `N-M`, surrounding
    /// whitespace (such as sysfs's trailing newline) ignored.
    fn from_str(s: &str) -> Result<Self, CpuSetError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(CpuSetError::Empty);
        }
        let mut words = Vec::new();
        for element in s.split(',') {
            let element = element.trim();
            let (lo, hi) = match element.split_once('-') {
                Some((lo, hi)) => (parse_id(lo, element)?, parse_id(hi, element)?),
                None => {
                    let id = parse_id(element, element)?;
                    (id, id)
                }
            };
            if lo > hi {
                return Err(CpuSetError::Backwards { lo, hi });
            }
            for cpu in lo..=hi {
                set_bit(&mut words, cpu);
            }
        }
        Ok(CpuSet::from_words(words))
    }
}

fn parse_id(text: &str, element: &str) -> Result<u32, CpuSetError> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuSetError::BadElement(element.to_string()));
    }
    let value: u64 = text.parse().map_err(|_| CpuSetError::TooLarge(u64::MAX))?;
    match u32::try_from(value) {
        Ok(cpu) if cpu <= MAX_CPU_ID => Ok(cpu),
        _ => Err(CpuSetError::TooLarge(value)),
    }
}

impl fmt::Display for CpuSet {
    /// Formats in the kernel's list syntax with maximal ranges, e.g. `0-3,8,10-11`;
    /// the empty set formats as the empty string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut iter = self.iter().peekable();
        let mut first_element = true;
        while let Some(lo) = iter.next() {
            let mut hi = lo;
            while iter.peek() == Some(&(hi + 1)) {
                hi += 1;
                iter.next();
            }
            if !first_element {
                f.write_str(",")?;
            }
            first_element = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_formats_kernel_lists() {
        let set: CpuSet = "0-3,8,10-11".parse().unwrap();
        assert_eq!(set.len(), 7);
        assert!(set.contains(2) && set.contains(8) && !set.contains(9));
        assert_eq!(set.to_string(), "0-3,8,10-11");
        assert_eq!("5\n".parse::<CpuSet>().unwrap(), CpuSet::single(5));
        assert_eq!("3,1,2".parse::<CpuSet>().unwrap().to_string(), "1-3");
    }

    #[test]
    fn rejects_malformed_lists() {
        assert_eq!("".parse::<CpuSet>(), Err(CpuSetError::Empty));
        assert!(matches!(
            "a".parse::<CpuSet>(),
            Err(CpuSetError::BadElement(_))
        ));
        assert!(matches!(
            "1-".parse::<CpuSet>(),
            Err(CpuSetError::BadElement(_))
        ));
        assert!(matches!(
            "1,,2".parse::<CpuSet>(),
            Err(CpuSetError::BadElement(_))
        ));
        assert!(matches!(
            "-1".parse::<CpuSet>(),
            Err(CpuSetError::BadElement(_))
        ));
        assert_eq!(
            "5-3".parse::<CpuSet>(),
            Err(CpuSetError::Backwards { lo: 5, hi: 3 })
        );
        assert!(matches!(
            "0-4000000000".parse::<CpuSet>(),
            Err(CpuSetError::TooLarge(_))
        ));
        assert!(matches!(
            "99999999999999999999999".parse::<CpuSet>(),
            Err(CpuSetError::TooLarge(_))
        ));
    }

    #[test]
    fn stays_small() {
        assert!(std::mem::size_of::<CpuSet>() <= 24);
    }

    #[test]
    fn set_operations() {
        let a: CpuSet = "0-7".parse().unwrap();
        let b: CpuSet = "4-11".parse().unwrap();
        assert_eq!(a.intersection(&b).to_string(), "4-7");
        assert_eq!(a.union(&b).to_string(), "0-11");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        let mut c = CpuSet::new();
        c.insert(100);
        c.insert(3);
        assert_eq!(c.to_string(), "3,100");
        c.remove(100);
        assert_eq!(c, CpuSet::single(3));
        assert_eq!(CpuSet::range(2, 1), CpuSet::new());
        assert_eq!(c.last(), Some(3));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn display_parse_roundtrip(cpus in proptest::collection::btree_set(0u32..300, 1..40)) {
            let set: CpuSet = cpus.iter().copied().collect();
            let text = set.to_string();
            let back: CpuSet = text.parse().unwrap();
            prop_assert_eq!(&back, &set);
            prop_assert_eq!(set.len(), cpus.len());
            prop_assert_eq!(set.iter().collect::<Vec<_>>(), cpus.iter().copied().collect::<Vec<_>>());
        }

        #[test]
        fn canonical_equality(cpus in proptest::collection::btree_set(0u32..200, 0..30)) {
            // Built by insertion in any order or collected: equal sets compare equal.
            let collected: CpuSet = cpus.iter().copied().collect();
            let mut inserted = CpuSet::new();
            for cpu in cpus.iter().rev() {
                inserted.insert(*cpu);
            }
            prop_assert_eq!(collected, inserted);
        }
    }
}
