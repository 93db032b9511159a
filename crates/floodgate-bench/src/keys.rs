//! The keys a keyed group's threads visit: uniformly, each thread on its own share,
//! or Zipf-distributed.
//!
//! * **Uniform** ([`key_for`]): each thread walks its own multiplicative scramble of
//!   the key space, computed per decision (a multiply, a xor and a modulo).
//! * **Disjoint** ([`share_of`]): the same scramble over the thread's own share of the
//!   keys (thread `t` of `n`: keys `t·k/n .. (t+1)·k/n`), so no two threads ever visit
//!   one key — issue 10's "2 threads on distinct keys, 500k each".
//! * **Zipf** ([`ZipfKeys`]): rank `k` of `n` is drawn with probability
//!   `k^-s / H(n, s)` (here `s` = [`ZIPF_EXPONENT`] = 1: a few hot keys, a long tail,
//!   the skew of real traffic), by inverse transform on the distribution's table of
//!   cumulative probabilities ([`Zipf`]) with a seeded splitmix64 generator. Ranks
//!   become keys through a fixed random permutation of `0..n`, so the hot keys are
//!   scattered over the key space (and over any table's shards) rather than being the
//!   first keys inserted. The draws are made once, before any measured run, into one
//!   sequence of [`ZipfKeys::len`] keys that every thread reads from its own starting
//!   point: the timed loop reads a table and computes nothing.
//!
//! The Zipf sequence is the same for every contender (one seed), so every column of a
//! group decides on the same keys in the same order.

use std::sync::{Arc, Mutex, PoisonError};

/// The Zipf exponent `s` of the skewed keyed groups: rank `k` is visited in
/// proportion to `1 / k`.
pub const ZIPF_EXPONENT: f64 = 1.0;

/// The seed of the skewed groups' draws (any fixed value: the sequence is the same in
/// every run).
pub const ZIPF_SEED: u64 = 0x2026_1201_F100_D6A7;

/// How the threads of a keyed group pick keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyDistribution {
    /// Every key equally often: each thread walks its own scramble ([`key_for`]).
    Uniform,
    /// Zipf with exponent [`ZIPF_EXPONENT`]: rank 1 most often, rank `k` in
    /// proportion to `1 / k` ([`ZipfKeys`]).
    Zipf,
    /// Every key of a thread's own share equally often; no key shared between
    /// threads ([`share_of`]).
    Disjoint,
}

impl KeyDistribution {
    /// Every distribution, uniform first; a matrix runner names one by its index here.
    pub const ALL: [KeyDistribution; 3] = [
        KeyDistribution::Uniform,
        KeyDistribution::Zipf,
        KeyDistribution::Disjoint,
    ];

    /// The name in the table, JSON and benchmark ids.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::keys::KeyDistribution;
    /// assert_eq!(KeyDistribution::Zipf.id(), "zipf");
    /// ```
    pub fn id(self) -> &'static str {
        match self {
            KeyDistribution::Uniform => "uniform",
            KeyDistribution::Zipf => "zipf",
            KeyDistribution::Disjoint => "disjoint",
        }
    }

    /// What the threads do, for a group's workload text.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::keys::KeyDistribution;
    /// assert!(KeyDistribution::Zipf.description().contains("Zipf"));
    /// ```
    pub fn description(self) -> &'static str {
        match self {
            KeyDistribution::Uniform => "each thread walks its own scrambled sequence",
            KeyDistribution::Zipf => {
                "keys Zipf-distributed (s = 1: rank k visited in proportion to 1/k), each \
                 thread reading its own stretch of one precomputed sequence"
            }
            KeyDistribution::Disjoint => {
                "each thread walks its own scrambled sequence of its own share of the keys \
                 (no key shared between threads)"
            }
        }
    }
}

/// The key of operation `op` on thread `thread` among `keys` keys: a multiplicative
/// scramble, each thread on its own sequence.
///
/// # Examples
///
/// ```
/// use floodgate_bench::keys::key_for;
/// assert!((0..1_000).all(|op| key_for(3, op, 100) < 100));
/// ```
pub fn key_for(thread: usize, op: u64, keys: u64) -> u64 {
    let thread = (thread as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (op.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ thread) % keys.max(1)
}

/// Thread `thread`'s uniform keys, one per call: `key_for(thread, 0, keys)`, … (built
/// in the harness's untimed per-thread setup).
pub(crate) fn keys_of(thread: usize, keys: u64) -> impl FnMut() -> u64 {
    let mut op = 0u64;
    move || {
        let key = key_for(thread, op, keys);
        op = op.wrapping_add(1);
        key
    }
}

/// Thread `thread` of `threads`' share of `keys` keys, as `(first key, number of
/// keys)`: `thread·keys/threads .. (thread+1)·keys/threads`, so the shares of all the
/// threads cover every key once (with fewer keys than threads, some shares are empty).
///
/// # Examples
///
/// ```
/// use floodgate_bench::keys::share_of;
/// assert_eq!(share_of(0, 2, 1_000_000), (0, 500_000));
/// assert_eq!(share_of(1, 2, 1_000_000), (500_000, 500_000));
/// assert_eq!(share_of(2, 3, 10), (6, 4));
/// ```
pub fn share_of(thread: usize, threads: usize, keys: u64) -> (u64, u64) {
    let threads = threads.max(1) as u128;
    let thread = (thread as u128).min(threads - 1);
    let bound = |t: u128| (t * u128::from(keys) / threads) as u64;
    let (start, end) = (bound(thread), bound(thread + 1));
    (start, end - start)
}

/// Thread `thread`'s keys in its own share ([`share_of`]), one per call: the uniform
/// scramble ([`key_for`]) of the share, offset to its first key. A thread whose share
/// is empty visits the last key (only with fewer keys than threads).
pub(crate) fn share_keys_of(thread: usize, threads: usize, keys: u64) -> impl FnMut() -> u64 {
    let (start, len) = share_of(thread, threads, keys);
    let start = if len == 0 {
        keys.saturating_sub(1)
    } else {
        start
    };
    let mut walk = keys_of(thread, len);
    move || start + walk()
}

/// The Zipf distribution over ranks `1..=n`, as its cumulative probabilities: rank `k`
/// has probability `k^-s / H(n, s)`, where `H(n, s) = Σ_{j ≤ n} j^-s`.
///
/// A table of `n` `f64`s (8 MB for a million ranks); each draw is a binary search in
/// it. Built once per prepared run, outside any timing.
#[derive(Clone, Debug)]
pub struct Zipf {
    /// `cdf[k - 1]` = P(rank ≤ k); the last entry is exactly 1.
    cdf: Box<[f64]>,
}

impl Zipf {
    /// Zipf over `n` ranks (at least 1) with exponent `exponent`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::keys::Zipf;
    /// let zipf = Zipf::new(3, 1.0);
    /// // 1 : 1/2 : 1/3, normalised by 11/6.
    /// assert!((zipf.probability(1) - 6.0 / 11.0).abs() < 1e-12);
    /// assert!((zipf.probability(3) - 2.0 / 11.0).abs() < 1e-12);
    /// ```
    pub fn new(n: u64, exponent: f64) -> Zipf {
        let n = n.max(1);
        let mut total = 0.0;
        let mut cdf: Box<[f64]> = (1..=n)
            .map(|rank| {
                total += (rank as f64).powf(-exponent);
                total
            })
            .collect();
        for c in cdf.iter_mut() {
            *c /= total;
        }
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        Zipf { cdf }
    }

    /// The number of ranks.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate_bench::keys::Zipf::new(0, 1.0).ranks(), 1);
    /// ```
    pub fn ranks(&self) -> u64 {
        self.cdf.len() as u64
    }

    /// The probability of rank `rank` (0 outside `1..=n`).
    ///
    /// # Examples
    ///
    /// ```
    /// let zipf = floodgate_bench::keys::Zipf::new(10, 1.0);
    /// assert!(zipf.probability(1) > zipf.probability(2));
    /// assert_eq!(zipf.probability(11), 0.0);
    /// ```
    pub fn probability(&self, rank: u64) -> f64 {
        let Some(index) = rank.checked_sub(1).map(|i| i as usize) else {
            return 0.0;
        };
        match (self.cdf.get(index), index.checked_sub(1)) {
            (Some(&c), Some(before)) => c - self.cdf[before],
            (Some(&c), None) => c,
            (None, _) => 0.0,
        }
    }

    /// The rank at cumulative probability `u` (inverse transform): the smallest `k`
    /// with P(rank ≤ k) > `u`. A `u` drawn uniformly from `[0, 1)` gives a
    /// Zipf-distributed rank; `u` outside it is clamped to rank 1 or `n`.
    ///
    /// # Examples
    ///
    /// ```
    /// let zipf = floodgate_bench::keys::Zipf::new(3, 1.0); // cdf 6/11, 9/11, 1
    /// assert_eq!(zipf.rank_at(0.0), 1);
    /// assert_eq!(zipf.rank_at(0.5), 1);
    /// assert_eq!(zipf.rank_at(0.6), 2);
    /// assert_eq!(zipf.rank_at(0.99), 3);
    /// ```
    pub fn rank_at(&self, u: f64) -> u64 {
        let below = self.cdf.partition_point(|&c| c <= u);
        below.min(self.cdf.len() - 1) as u64 + 1
    }
}

/// A long precomputed sequence of keys in `0..keys`, Zipf-distributed with exponent
/// [`ZIPF_EXPONENT`]: what the skewed keyed groups' threads visit.
///
/// Its length is twice the key count rounded up to a power of two, within
/// [`ZipfKeys::MIN_LEN`]`..=`[`ZipfKeys::MAX_LEN`] (8 MB of keys at most, shared by
/// every thread, however many). Each thread reads it from its own starting point,
/// wrapping around ([`ZipfKeys::walk`]).
#[derive(Clone, Debug)]
pub struct ZipfKeys {
    sequence: Arc<[u64]>,
}

impl ZipfKeys {
    /// The shortest sequence (2^16 keys).
    pub const MIN_LEN: usize = 1 << 16;
    /// The longest sequence (2^20 keys).
    pub const MAX_LEN: usize = 1 << 20;

    /// Draws the sequence for `keys` keys (at least 1) from `seed`: the same keys for
    /// the same arguments.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::keys::{ZipfKeys, ZIPF_SEED};
    /// let keys = ZipfKeys::new(1_000, ZIPF_SEED);
    /// assert_eq!(keys.len(), ZipfKeys::MIN_LEN);
    /// assert!(keys.as_slice().iter().all(|&k| k < 1_000));
    /// assert_eq!(keys.as_slice(), ZipfKeys::new(1_000, ZIPF_SEED).as_slice());
    /// ```
    pub fn new(keys: u64, seed: u64) -> ZipfKeys {
        let keys = keys.max(1);
        let len = Self::len_for(keys);
        let zipf = Zipf::new(keys, ZIPF_EXPONENT);
        let mut rng = SplitMix64(seed);
        let key_of_rank = permutation(keys, &mut rng);
        let sequence = (0..len)
            .map(|_| key_of_rank[(zipf.rank_at(rng.unit()) - 1) as usize])
            .collect();
        ZipfKeys { sequence }
    }

    /// The sequence of [`ZipfKeys::new`]`(keys, seed)`, drawn once per process and
    /// shared after: every contender, thread count and repeat of a group prepares its
    /// runs on the same sequence, and a draw of a million keys takes a noticeable
    /// fraction of a second (seconds, unoptimised). What was drawn stays (8 MB at most
    /// per key count).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::keys::{ZipfKeys, ZIPF_SEED};
    /// let shared = ZipfKeys::shared(1_000, ZIPF_SEED);
    /// assert_eq!(shared.as_slice(), ZipfKeys::new(1_000, ZIPF_SEED).as_slice());
    /// assert_eq!(shared.as_slice().as_ptr(), ZipfKeys::shared(1_000, ZIPF_SEED).as_slice().as_ptr());
    /// ```
    pub fn shared(keys: u64, seed: u64) -> ZipfKeys {
        static DRAWN: Mutex<Vec<(u64, u64, ZipfKeys)>> = Mutex::new(Vec::new());
        let mut drawn = DRAWN.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, sequence)) = drawn.iter().find(|d| (d.0, d.1) == (keys, seed)) {
            return sequence.clone();
        }
        let sequence = ZipfKeys::new(keys, seed);
        drawn.push((keys, seed, sequence.clone()));
        sequence
    }

    /// The length of the sequence for `keys` keys: twice the key count rounded up to
    /// a power of two, within [`ZipfKeys::MIN_LEN`]`..=`[`ZipfKeys::MAX_LEN`].
    fn len_for(keys: u64) -> usize {
        usize::try_from(keys.saturating_mul(2))
            .ok()
            .and_then(usize::checked_next_power_of_two)
            .unwrap_or(Self::MAX_LEN)
            .clamp(Self::MIN_LEN, Self::MAX_LEN)
    }

    /// The number of keys in the sequence (a power of two).
    pub fn len(&self) -> usize {
        self.sequence.len()
    }

    /// Never: a sequence holds at least [`ZipfKeys::MIN_LEN`] keys.
    pub fn is_empty(&self) -> bool {
        self.sequence.is_empty()
    }

    /// The keys, in the order the threads visit them.
    pub fn as_slice(&self) -> &[u64] {
        &self.sequence
    }

    /// Thread `thread` of `threads`' keys, one per call: the sequence from the
    /// thread's own starting point (`thread × len ÷ threads`), wrapping around. Each
    /// call is one table read.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_bench::keys::{ZipfKeys, ZIPF_SEED};
    /// let keys = ZipfKeys::new(100, ZIPF_SEED);
    /// let mut second = keys.walk(1, 2);
    /// assert_eq!(second(), keys.as_slice()[keys.len() / 2]);
    /// ```
    pub fn walk(&self, thread: usize, threads: usize) -> impl FnMut() -> u64 {
        let sequence = Arc::clone(&self.sequence);
        let mask = sequence.len() - 1;
        let mut at = (thread % threads.max(1)) * (sequence.len() / threads.max(1));
        move || {
            let key = sequence[at];
            at = (at + 1) & mask;
            key
        }
    }
}

/// A random permutation of `0..n` (Fisher–Yates): entry `rank - 1` is rank's key.
fn permutation(n: u64, rng: &mut SplitMix64) -> Box<[u64]> {
    let mut keys: Box<[u64]> = (0..n).collect();
    for i in (1..keys.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        keys.swap(i, j);
    }
    keys
}

/// Four well-mixed words from `seed` (the first four of its splitmix64 stream): the
/// keys of a run's hashers ([`Setup::hasher`](crate::matrix::Setup::hasher)).
pub(crate) fn seed_words(seed: u64) -> [u64; 4] {
    let mut rng = SplitMix64(seed);
    [rng.next(), rng.next(), rng.next(), rng.next()]
}

/// splitmix64 (Steele, Lea and Flood): a seeded generator good enough for drawing
/// benchmark keys, and a few lines instead of a dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`: the top 53 bits as a fraction.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (multiply-shift; its bias, at most n / 2^64, is nothing here).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How often each key of `0..n` occurs in `keys`.
    fn counts(keys: &[u64], n: u64) -> Vec<u64> {
        let mut counts = vec![0u64; n as usize];
        for &key in keys {
            counts[key as usize] += 1;
        }
        counts
    }

    #[test]
    fn each_thread_walks_its_own_uniform_key_sequence() {
        for thread in [0, 1, 7] {
            let mut next_key = keys_of(thread, 100_000);
            for op in 0..100 {
                assert_eq!(next_key(), key_for(thread, op, 100_000));
            }
        }
        assert_ne!(
            (0..8).map(|op| key_for(0, op, 1_000)).collect::<Vec<_>>(),
            (0..8).map(|op| key_for(1, op, 1_000)).collect::<Vec<_>>()
        );
        assert_eq!(key_for(5, 9, 1), 0);
    }

    #[test]
    fn splitmix64_matches_its_reference_values() {
        // The reference implementation (Vigna's splitmix64.c) seeded with 0.
        let mut rng = SplitMix64(0);
        assert_eq!(rng.next(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next(), 0x6E78_9E6A_A1B9_65F4);
        assert!((0..10_000).all(|_| (0.0..1.0).contains(&rng.unit())));
        assert!((0..10_000).all(|_| rng.below(7) < 7));
    }

    #[test]
    fn the_cumulative_table_is_exact_for_a_few_ranks() {
        let zipf = Zipf::new(4, 1.0);
        let h = 1.0 + 1.0 / 2.0 + 1.0 / 3.0 + 1.0 / 4.0;
        for rank in 1..=4 {
            let expected = 1.0 / rank as f64 / h;
            assert!((zipf.probability(rank) - expected).abs() < 1e-12, "{rank}");
        }
        assert_eq!((zipf.probability(0), zipf.probability(5)), (0.0, 0.0));
        // The inverse transform's boundaries: P(rank ≤ 1) = 1/h.
        assert_eq!(zipf.rank_at(1.0 / h - 1e-9), 1);
        assert_eq!(zipf.rank_at(1.0 / h + 1e-9), 2);
        assert_eq!(zipf.rank_at(0.999_999_999), 4);
        assert_eq!((zipf.rank_at(-1.0), zipf.rank_at(2.0)), (1, 4));
        // Exponent 0 is uniform.
        let flat = Zipf::new(5, 0.0);
        assert!((1..=5).all(|r| (flat.probability(r) - 0.2).abs() < 1e-12));
    }

    #[test]
    fn the_permutation_is_a_bijection_and_not_the_identity() {
        let keys = permutation(10_000, &mut SplitMix64(ZIPF_SEED));
        let mut sorted = keys.to_vec();
        sorted.sort_unstable();
        assert!(sorted.iter().copied().eq(0..10_000));
        let fixed = keys.iter().enumerate().filter(|&(i, &k)| i as u64 == k);
        // A random permutation fixes one point on average.
        assert!(fixed.count() < 10);
    }

    #[test]
    fn a_sequence_is_deterministic_in_range_and_depends_on_its_seed() {
        let a = ZipfKeys::new(1_000, ZIPF_SEED);
        assert_eq!(a.as_slice(), ZipfKeys::new(1_000, ZIPF_SEED).as_slice());
        assert_ne!(a.as_slice(), ZipfKeys::new(1_000, ZIPF_SEED + 1).as_slice());
        assert!(a.as_slice().iter().all(|&k| k < 1_000));
        assert!(!a.is_empty());
        assert_eq!(a.len(), ZipfKeys::MIN_LEN);
        assert_eq!(ZipfKeys::new(40_000, 1).len(), 1 << 17);
        for (keys, len) in [
            (0, ZipfKeys::MIN_LEN),
            (32_768, 1 << 16),
            (32_769, 1 << 17),
            (100_000, 1 << 18),
            (1 << 19, 1 << 20),
            (1_000_000, 1 << 20),
            (u64::MAX, ZipfKeys::MAX_LEN),
        ] {
            assert_eq!(ZipfKeys::len_for(keys), len, "{keys} keys");
        }
        assert!(ZipfKeys::new(1, 1).as_slice().iter().all(|&k| k == 0));
    }

    #[test]
    fn the_hottest_key_is_rank_one_and_frequencies_follow_one_over_rank() {
        const N: u64 = 1_000;
        let keys = ZipfKeys::new(N, ZIPF_SEED);
        let counts = counts(keys.as_slice(), N);
        // Ranks by frequency: rank 1 is the permutation's first key.
        let key_of_rank = permutation(N, &mut SplitMix64(ZIPF_SEED));
        let count_of_rank = |rank: usize| counts[key_of_rank[rank - 1] as usize] as f64;
        let hottest = (0..N as usize).max_by_key(|&k| counts[k]).unwrap();
        assert_eq!(hottest as u64, key_of_rank[0]);
        let draws = keys.len() as f64;
        let h: f64 = (1..=N).map(|k| 1.0 / k as f64).sum();
        // Rank 1 takes 1/H(1000) ≈ 13.4 % of the draws (65 536 draws: σ ≈ 0.13 %).
        let share = count_of_rank(1) / draws;
        assert!((share - 1.0 / h).abs() < 0.01, "rank 1 share {share}");
        // Rank k about 1/k of rank 1 (σ of each count ≈ its square root).
        for rank in [2, 3, 5, 10] {
            let ratio = count_of_rank(rank) / count_of_rank(1);
            let expected = 1.0 / rank as f64;
            assert!(
                (ratio - expected).abs() < 0.15 * expected,
                "rank {rank}: {ratio} of rank 1, expected {expected}"
            );
        }
        // And by bands, where single counts are too small: ranks 101..=1000 take
        // (H(1000) − H(100)) / H(1000) ≈ 31 % of the draws.
        let tail: f64 = (101..=N as usize).map(count_of_rank).sum::<f64>() / draws;
        let expected_tail: f64 = (101..=N).map(|k| 1.0 / k as f64).sum::<f64>() / h;
        assert!(
            (tail - expected_tail).abs() < 0.01,
            "{tail} vs {expected_tail}"
        );
    }

    #[test]
    fn uniform_sequences_have_no_hot_key() {
        // The contrast the Zipf groups exist for: no key of the uniform walk takes
        // more than a few times its fair share.
        let mut next = keys_of(0, 1_000);
        let keys: Vec<u64> = (0..65_536).map(|_| next()).collect();
        let max = *counts(&keys, 1_000).iter().max().unwrap();
        assert!(max < 3 * 65_536 / 1_000, "{max}");
    }

    #[test]
    fn disjoint_shares_cover_every_key_once_and_no_walk_leaves_its_own() {
        for (threads, keys) in [(1, 1_000u64), (2, 1_000_000), (3, 1_000), (4, 10), (3, 2)] {
            let mut covered = 0;
            for thread in 0..threads {
                let (start, len) = share_of(thread, threads, keys);
                assert_eq!(start, covered, "shares are contiguous");
                covered += len;
                if len == 0 {
                    continue;
                }
                let mut next = share_keys_of(thread, threads, keys);
                let visited: Vec<u64> = (0..4 * len.min(10_000)).map(|_| next()).collect();
                assert!(visited.iter().all(|k| (start..start + len).contains(k)));
                if len <= 1_000 {
                    // The scramble is not a permutation of a share whose length is not
                    // a power of two, but it reaches nearly all of it.
                    let mut seen = visited.clone();
                    seen.sort_unstable();
                    seen.dedup();
                    assert!(
                        seen.len() as u64 * 100 >= len * 95,
                        "{} of {len}",
                        seen.len()
                    );
                }
            }
            assert_eq!(covered, keys);
        }
        // Fewer keys than threads: an empty share still visits a real key.
        let mut next = share_keys_of(2, 3, 2);
        assert!(next() < 2);
    }

    #[test]
    fn threads_start_at_evenly_spaced_points_and_wrap() {
        let keys = ZipfKeys::new(100, 3);
        let len = keys.len();
        for (thread, threads) in [(0, 1), (1, 4), (3, 4), (2, 3)] {
            let mut walk = keys.walk(thread, threads);
            let start = thread * (len / threads);
            for i in 0..10 {
                assert_eq!(walk(), keys.as_slice()[start + i]);
            }
        }
        let mut last = keys.walk(0, 1);
        for _ in 0..len {
            last();
        }
        assert_eq!(last(), keys.as_slice()[0], "wraps around");
    }
}
