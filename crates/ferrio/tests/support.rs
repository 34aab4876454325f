//! Helpers shared by the test modules: test data, and the rule for tests that need a GPU.

/// Fails the calling test, saying why, when CUDA cannot be used here: GPU tests are ignored
/// unless asked for, and a GPU test asked for on a machine without one must not pass.
#[macro_export]
macro_rules! require_cuda {
    () => {
        if let Err(e) = ferrio::cuda::available() {
            panic!("this test needs a CUDA GPU and none can be used here: {e}");
        }
    };
}

/// xorshift64*: the one pseudo-random generator of the tests, deterministic per seed, with no
/// dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value; 0 is mapped to a non-zero state).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random-looking bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// `len` pseudo-random bytes from `seed`: reproducible, and never a run of zeros that a missing
/// copy could match.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A non-zero, position-dependent pattern to fill destinations with before a transfer.
pub fn poison(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) as u8) ^ 0xA5 | 0x01)
        .collect()
}

/// Index of the first differing byte, for assertion messages.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or(if a.len() == b.len() {
            None
        } else {
            Some(a.len().min(b.len()))
        })
}

/// Asserts two byte ranges are equal, naming the first differing byte instead of dumping both.
#[track_caller]
pub fn assert_bytes_eq(actual: &[u8], expected: &[u8], what: &str) {
    if let Some(i) = first_difference(actual, expected) {
        panic!(
            "{what}: first difference at byte {i} of {} (actual {:?}, expected {:?})",
            expected.len(),
            actual.get(i),
            expected.get(i)
        );
    }
}
