//! Workload generators for `salsa bench`: sequential, uniform random, static hot/cold, static
//! Zipf, SepBIT's dynamic Zipf, and trace replay (see [`super::trace`]). A generator yields
//! requests in blocks of the benchmark's block size; it is deterministic for a seed.

use super::trace::{OpKind, TraceOp};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// One request, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub kind: OpKind,
    pub offset: u64,
    pub len: u64,
    /// Microseconds since the start of the trace (replay at recorded time); 0 for synthetic.
    pub at_us: u64,
}

/// A workload as named on the command line.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    Sequential,
    Uniform,
    /// `hot_writes_percent` of writes go to `hot_space_percent` of the space.
    HotCold {
        hot_writes_percent: f64,
        hot_space_percent: f64,
    },
    /// Zipf over blocks with skew `s`; ranks spread over the space by a fixed permutation.
    Zipf {
        skew: f64,
    },
    /// SepBIT's dynamic Zipf: the hottest 20% of ranks own a fixed 20% of the addresses, and
    /// after every `interval_bytes` written the ranks are shuffled among those addresses (the
    /// hot set stays, which address is how hot changes), as its authors' generator does.
    DynamicZipf {
        skew: f64,
        interval_bytes: u64,
    },
    /// Replay of a trace file.
    Trace(std::path::PathBuf),
}

impl std::str::FromStr for Spec {
    type Err = String;
    /// `seq`, `uniform`, `hotcold:80/20`, `zipf:1.0`, `dynzipf:1.0[:40M]`, `trace:PATH`.
    fn from_str(s: &str) -> Result<Spec, String> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        let num = |v: &str, what: &str| -> Result<f64, String> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{what} {v:?} in workload {s:?} is not a non-negative number"))
        };
        match kind {
            "seq" | "sequential" => Ok(Spec::Sequential),
            "uniform" | "random" => Ok(Spec::Uniform),
            "hotcold" => {
                let (w, sp) = arg
                    .split_once('/')
                    .ok_or_else(|| format!("hotcold wants WRITES/SPACE percentages, e.g. hotcold:80/20; got {s:?}"))?;
                let (w, sp) = (num(w, "write share")?, num(sp, "space share")?);
                if !((0.0..=100.0).contains(&w) && 0.0 < sp && sp < 100.0) {
                    return Err(format!("hotcold percentages out of range in {s:?}"));
                }
                Ok(Spec::HotCold {
                    hot_writes_percent: w,
                    hot_space_percent: sp,
                })
            }
            "zipf" => Ok(Spec::Zipf {
                skew: num(if arg.is_empty() { "1.0" } else { arg }, "skew")?,
            }),
            "dynzipf" => {
                let (skew, interval) = arg.split_once(':').unwrap_or((arg, "40M"));
                let skew = num(if skew.is_empty() { "1.0" } else { skew }, "skew")?;
                let interval_bytes = crate::spec::parse_size(interval)?;
                if interval_bytes == 0 {
                    return Err("dynzipf interval must be positive".into());
                }
                Ok(Spec::DynamicZipf { skew, interval_bytes })
            }
            "trace" if !arg.is_empty() => Ok(Spec::Trace(arg.into())),
            _ => Err(format!(
                "unknown workload {s:?}; use seq, uniform, hotcold:80/20, zipf:1.0, dynzipf:1.0[:40M] or trace:PATH"
            )),
        }
    }
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spec::Sequential => write!(f, "seq"),
            Spec::Uniform => write!(f, "uniform"),
            Spec::HotCold {
                hot_writes_percent,
                hot_space_percent,
            } => write!(f, "hotcold:{hot_writes_percent}/{hot_space_percent}"),
            Spec::Zipf { skew } => write!(f, "zipf:{skew}"),
            Spec::DynamicZipf { skew, interval_bytes } => write!(f, "dynzipf:{skew}:{}M", interval_bytes >> 20),
            Spec::Trace(p) => write!(f, "trace:{}", p.display()),
        }
    }
}

/// Draws block numbers (or replays a trace) and mixes reads in.
pub struct Generator {
    source: Source,
    blocks: u64,
    block_bytes: u64,
    read_fraction: f64,
    rng: SmallRng,
}

enum Source {
    Sequential {
        next: u64,
    },
    Uniform,
    HotCold {
        hot_blocks: u64,
        hot_fraction: f64,
        perm: Vec<u32>,
    },
    Zipf {
        zipf: Zipf<f64>,
        perm: Vec<u32>,
    },
    DynamicZipf {
        zipf: Zipf<f64>,
        perm: Vec<u32>,
        hot_ranks: u64,
        interval_blocks: u64,
        since: u64,
    },
    Trace {
        ops: Vec<TraceOp>,
        next: usize,
    },
}

/// A random permutation of block numbers, so that ranks (or the hot region) are spread over the
/// address space.
fn permutation(blocks: u64, rng: &mut SmallRng) -> Vec<u32> {
    let mut v: Vec<u32> = (0..blocks as u32).collect();
    v.shuffle(rng);
    v
}

impl Generator {
    /// A generator over `volume_bytes` in blocks of `block_bytes`; `ops` is the parsed trace
    /// for [`Spec::Trace`].
    pub fn new(
        spec: &Spec,
        volume_bytes: u64,
        block_bytes: u64,
        read_percent: f64,
        seed: u64,
        ops: Option<Vec<TraceOp>>,
    ) -> Result<Generator, String> {
        let blocks = volume_bytes / block_bytes;
        if blocks == 0 || blocks > u32::MAX as u64 {
            return Err(format!("{blocks} blocks: the volume must hold 1 to 2^32 blocks"));
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let zipf = |skew: f64| Zipf::new(blocks, skew).map_err(|e| format!("zipf skew {skew}: {e}"));
        let source = match spec {
            Spec::Sequential => Source::Sequential { next: 0 },
            Spec::Uniform => Source::Uniform,
            Spec::HotCold {
                hot_writes_percent,
                hot_space_percent,
            } => Source::HotCold {
                hot_blocks: ((blocks as f64 * hot_space_percent / 100.0) as u64).clamp(1, blocks - 1),
                hot_fraction: hot_writes_percent / 100.0,
                perm: permutation(blocks, &mut rng),
            },
            Spec::Zipf { skew } => Source::Zipf {
                zipf: zipf(*skew)?,
                perm: permutation(blocks, &mut rng),
            },
            Spec::DynamicZipf { skew, interval_bytes } => Source::DynamicZipf {
                zipf: zipf(*skew)?,
                perm: permutation(blocks, &mut rng),
                hot_ranks: (blocks / 5).max(1),
                interval_blocks: (interval_bytes / block_bytes).max(1),
                since: 0,
            },
            Spec::Trace(_) => Source::Trace {
                ops: ops.ok_or("trace workload without a parsed trace")?,
                next: 0,
            },
        };
        Ok(Generator {
            source,
            blocks,
            block_bytes,
            read_fraction: read_percent / 100.0,
            rng,
        })
    }

    /// Requests a trace holds, if this replays one.
    pub fn trace_len(&self) -> Option<usize> {
        match &self.source {
            Source::Trace { ops, .. } => Some(ops.len()),
            _ => None,
        }
    }

    /// The next request; `None` when a trace is exhausted.
    pub fn next_request(&mut self) -> Option<Request> {
        let rng = &mut self.rng;
        let block = match &mut self.source {
            Source::Trace { ops, next } => {
                let op = ops.get(*next)?;
                *next += 1;
                return Some(Request {
                    kind: op.kind,
                    offset: op.offset,
                    len: op.len,
                    at_us: op.at_us,
                });
            }
            Source::Sequential { next } => {
                let b = *next;
                *next = (*next + 1) % self.blocks;
                b
            }
            Source::Uniform => rng.gen_range(0..self.blocks),
            Source::HotCold {
                hot_blocks,
                hot_fraction,
                perm,
            } => {
                let idx = if rng.gen_bool(*hot_fraction) {
                    rng.gen_range(0..*hot_blocks)
                } else {
                    rng.gen_range(*hot_blocks..self.blocks)
                };
                perm[idx as usize] as u64
            }
            Source::Zipf { zipf, perm } => perm[(zipf.sample(rng) as u64 - 1) as usize] as u64,
            Source::DynamicZipf {
                zipf,
                perm,
                hot_ranks,
                interval_blocks,
                since,
            } => {
                *since += 1;
                if *since >= *interval_blocks {
                    *since = 0;
                    // Re-draw which hot address has which hot rank; the cold ranks keep theirs.
                    perm[..*hot_ranks as usize].shuffle(rng);
                }
                perm[(zipf.sample(rng) as u64 - 1) as usize] as u64
            }
        };
        let write = self.read_fraction <= 0.0 || !self.rng.gen_bool(self.read_fraction.min(1.0));
        Some(Request {
            kind: if write { OpKind::Write } else { OpKind::Read },
            offset: block * self.block_bytes,
            len: self.block_bytes,
            at_us: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes_to(spec: &str, n: usize) -> Vec<u64> {
        let mut g = Generator::new(&spec.parse().unwrap(), 1000 * 4096, 4096, 0.0, 7, None).unwrap();
        (0..n).map(|_| g.next_request().unwrap().offset / 4096).collect()
    }

    #[test]
    fn specs_parse_and_print() {
        for s in ["seq", "uniform", "hotcold:80/20", "zipf:1", "dynzipf:1:40M"] {
            let spec: Spec = s.parse().unwrap();
            assert_eq!(spec.to_string().parse::<Spec>().unwrap(), spec);
        }
        for bad in ["hotcold:80", "hotcold:120/20", "zipf:x", "dynzipf:1:0", "trace:", "nope"] {
            assert!(bad.parse::<Spec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn hot_cold_sends_the_hot_share_to_the_hot_blocks() {
        let w = writes_to("hotcold:80/20", 50_000);
        let mut count = vec![0u32; 1000];
        for b in &w {
            count[*b as usize] += 1;
        }
        count.sort_unstable_by(|a, b| b.cmp(a));
        let top: u32 = count[..200].iter().sum();
        let share = top as f64 / w.len() as f64;
        assert!((0.77..0.83).contains(&share), "top 20% of blocks took {share}");
    }

    #[test]
    fn zipf_is_skewed_and_dynamic_zipf_moves_its_hot_set() {
        let w = writes_to("zipf:1.0", 50_000);
        let hits = |w: &[u64]| {
            let mut c = std::collections::HashMap::<u64, u32>::new();
            for b in w {
                *c.entry(*b).or_default() += 1;
            }
            let mut v: Vec<(u64, u32)> = c.into_iter().collect();
            v.sort_by_key(|e| std::cmp::Reverse(e.1));
            v
        };
        let top = hits(&w);
        assert!(top[0].1 as f64 > 0.1 * w.len() as f64, "rank 1 should take about 13% of writes");
        // Dynamic: the hottest address of the first interval is not the hottest later, but
        // the hot set as a whole stays on the same 20% of the addresses.
        let d = writes_to("dynzipf:1.0:4M", 20_000); // re-drawn every 1024 writes
        let first = hits(&d[..1000]);
        let late = hits(&d[15_000..16_000]);
        assert_ne!(first[0].0, late[0].0);
        let hot_set: std::collections::HashSet<u64> = hits(&d).iter().take(200).map(|e| e.0).collect();
        let in_hot = d.iter().filter(|b| hot_set.contains(b)).count() as f64 / d.len() as f64;
        // The top 200 of 1000 ranks take H(200)/H(1000) = 78% of writes.
        assert!(in_hot > 0.7, "the hot set should keep its addresses; it took {in_hot}");
    }

    #[test]
    fn sequential_wraps() {
        assert_eq!(writes_to("seq", 1002)[1000..], [0, 1]);
    }
}
