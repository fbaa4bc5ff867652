// The key-value workloads of the RocksDB experiment (scripts/bench_rocksdb.py), all in one
// process so that a database on a device model inside the process (the plugin's setup) is
// measured with the same drive state throughout, as the setups on a served model are.
//
//   kvbench [--uri URI] --db PATH --keys N [--value BYTES] [--cache BYTES] [--threads T]
//           [--seconds S] [--phases LIST] [--direct 1]
//
// Phases, in the order given (default: all):
//   fillrandom        every key 0..N-1 written once, in a random order (db_bench's fillrandom
//                     writes N random keys; here each once, so the database has N keys)
//   overwrite         N uniformly random keys rewritten (as db_bench's, a count: the same work
//                     on every setup, so that what the drive wears for it compares)
//   readrandom        uniformly random gets for S seconds
//   readwhilewriting  T-1 threads of random gets while one thread rewrites, for S seconds
//                     (the readers' rate is the result, as db_bench's)
//   ycsb-a ... ycsb-f YCSB's core workloads over a scrambled Zipfian (theta 0.99) choice of
//                     keys: A 50% reads 50% updates; B 95/5; C reads only; D 95% reads of the
//                     latest keys, 5% inserts of new ones; F 50% reads, 50% read-modify-writes
// Each phase prints one JSON line: ops, seconds, ops per second, p50/p99/p999 latency in
// microseconds. At the end one line with RocksDB's own bytes written (flushes, compactions,
// WAL) from its statistics. Writes are not synced (db_bench's default); the WAL is on.
// `--direct 1` reads and compacts with O_DIRECT (on a kernel file system).

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace ROCKSDB_NAMESPACE;
using Clock = std::chrono::steady_clock;

static std::string key_of(uint64_t i) {
  char buf[32];
  snprintf(buf, sizeof buf, "user%016llu", static_cast<unsigned long long>(i));
  return buf;
}

static uint64_t fnv(uint64_t v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < 8; i++) {
    h ^= v & 0xff;
    h *= 0x100000001b3ull;
    v >>= 8;
  }
  return h;
}

// YCSB's Zipfian generator (Gray et al.), over [0, n).
class Zipfian {
 public:
  Zipfian(uint64_t n, double theta = 0.99) : n_(n), theta_(theta) {
    zeta2_ = zeta(2);
    zetan_ = zeta(n);
    alpha_ = 1.0 / (1.0 - theta);
    eta_ = (1 - std::pow(2.0 / n, 1 - theta)) / (1 - zeta2_ / zetan_);
  }
  uint64_t next(std::mt19937_64& rng) const {
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    double uz = u * zetan_;
    if (uz < 1.0) return 0;
    if (uz < 1.0 + std::pow(0.5, theta_)) return 1;
    return static_cast<uint64_t>(n_ * std::pow(eta_ * u - eta_ + 1, alpha_)) % n_;
  }

 private:
  double zeta(uint64_t n) const {
    double sum = 0;
    for (uint64_t i = 0; i < n; i++) sum += 1 / std::pow(i + 1, theta_);
    return sum;
  }
  uint64_t n_;
  double theta_, zeta2_, zetan_, alpha_, eta_;
};

struct Config {
  std::string uri, db, phases = "fillrandom,overwrite,readrandom,readwhilewriting,ycsb-a,ycsb-b,ycsb-c,ycsb-d,ycsb-f";
  uint64_t keys = 100000, value = 4096, cache = 64 << 20;
  int threads = 4;
  double seconds = 30;
  bool direct = false;
};

struct Shared {
  DB* db;
  const Config* cfg;
  std::atomic<uint64_t> inserted;  // keys 0..inserted-1 exist
  std::atomic<bool> failed{false};
  std::string error;
};

static void fail(Shared& s, const Status& st, const char* what) {
  if (!s.failed.exchange(true)) s.error = std::string(what) + ": " + st.ToString();
}

// One thread's share of a phase: its latencies in microseconds.
using Latencies = std::vector<uint32_t>;

static std::string value_for(std::mt19937_64& rng, uint64_t len) {
  std::string v(len, '\0');
  for (size_t i = 0; i + 8 <= len; i += 8) {
    uint64_t r = rng();
    memcpy(&v[i], &r, 8);
  }
  return v;
}

// Runs one operation of `phase` on thread `t`; returns false when the thread has nothing left.
static bool one_op(Shared& s, const std::string& phase, int t, std::mt19937_64& rng, const Zipfian& zipf,
                   std::vector<uint64_t>& fill_order, std::atomic<uint64_t>& fill_next) {
  DB* db = s.db;
  WriteOptions wo;
  ReadOptions ro;
  std::string got;
  uint64_t n = s.cfg->keys;
  auto zipf_key = [&] { return fnv(zipf.next(rng)) % n; };
  auto put = [&](uint64_t k) {
    Status st = db->Put(wo, key_of(k), value_for(rng, s.cfg->value));
    if (!st.ok()) fail(s, st, "put");
  };
  auto get = [&](uint64_t k) {
    Status st = db->Get(ro, key_of(k), &got);
    if (!st.ok() && !st.IsNotFound()) fail(s, st, "get");
  };
  std::uniform_int_distribution<uint64_t> uniform(0, n - 1);
  std::uniform_int_distribution<int> percent(0, 99);
  if (phase == "fillrandom") {
    uint64_t i = fill_next.fetch_add(1);
    if (i >= fill_order.size()) return false;
    put(fill_order[i]);
  } else if (phase == "overwrite") {
    if (fill_next.fetch_add(1) >= n) return false;
    put(uniform(rng));
  } else if (phase == "readrandom") {
    get(uniform(rng));
  } else if (phase == "readwhilewriting") {
    if (t == 0) put(uniform(rng)); else get(uniform(rng));
  } else if (phase == "ycsb-a") {
    if (percent(rng) < 50) get(zipf_key()); else put(zipf_key());
  } else if (phase == "ycsb-b") {
    if (percent(rng) < 95) get(zipf_key()); else put(zipf_key());
  } else if (phase == "ycsb-c") {
    get(zipf_key());
  } else if (phase == "ycsb-d") {
    if (percent(rng) < 95) {
      uint64_t top = s.inserted.load();
      uint64_t back = zipf.next(rng) % top;  // the latest keys most often
      get(top - 1 - back);
    } else {
      put(s.inserted.fetch_add(1));
    }
  } else if (phase == "ycsb-f") {
    uint64_t k = zipf_key();
    get(k);
    if (percent(rng) >= 50) put(k);  // read-modify-write: the read above, then the write
  } else {
    fprintf(stderr, "unknown phase %s\n", phase.c_str());
    exit(2);
  }
  return true;
}

static void run_phase(Shared& s, const std::string& phase) {
  const Config& cfg = *s.cfg;
  int threads = phase == "fillrandom" ? 1 : cfg.threads;
  if (phase == "readwhilewriting" && threads < 2) threads = 2;
  Zipfian zipf(cfg.keys);
  std::vector<uint64_t> fill_order;
  std::atomic<uint64_t> fill_next{0};
  if (phase == "fillrandom") {
    fill_order.resize(cfg.keys);
    for (uint64_t i = 0; i < cfg.keys; i++) fill_order[i] = i;
    std::mt19937_64 rng(42);
    std::shuffle(fill_order.begin(), fill_order.end(), rng);
  }
  std::vector<Latencies> lat(threads);
  std::atomic<bool> stop{false};
  auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t * 7919 + std::hash<std::string>()(phase));
      lat[t].reserve(1 << 16);
      while (!stop.load(std::memory_order_relaxed) && !s.failed.load()) {
        auto t0 = Clock::now();
        if (!one_op(s, phase, t, rng, zipf, fill_order, fill_next)) break;
        auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
        // readwhilewriting reports its readers only, as db_bench does.
        if (!(phase == "readwhilewriting" && t == 0)) lat[t].push_back(static_cast<uint32_t>(std::min<int64_t>(us, UINT32_MAX)));
      }
    });
  }
  if (phase != "fillrandom" && phase != "overwrite") {
    while (std::chrono::duration<double>(Clock::now() - start).count() < cfg.seconds && !s.failed.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stop = true;
  }
  for (auto& th : pool) th.join();
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  Latencies all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all.empty() ? 0u : all[std::min(all.size() - 1, static_cast<size_t>(p * all.size()))]; };
  printf("{\"phase\": \"%s\", \"ops\": %zu, \"seconds\": %.3f, \"ops_per_sec\": %.1f, \"p50_us\": %u, \"p99_us\": %u, \"p999_us\": %u}\n",
         phase.c_str(), all.size(), secs, all.size() / secs, pct(0.5), pct(0.99), pct(0.999));
  fflush(stdout);
}

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--uri") cfg.uri = v;
    else if (a == "--db") cfg.db = v;
    else if (a == "--keys") cfg.keys = std::stoull(v);
    else if (a == "--value") cfg.value = std::stoull(v);
    else if (a == "--cache") cfg.cache = std::stoull(v);
    else if (a == "--threads") cfg.threads = std::stoi(v);
    else if (a == "--seconds") cfg.seconds = std::stod(v);
    else if (a == "--phases") cfg.phases = v;
    else if (a == "--direct") cfg.direct = v == "1";
    else {
      fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (cfg.db.empty() || cfg.keys == 0 || cfg.threads < 1) {
    fprintf(stderr, "usage: kvbench [--uri URI] --db PATH --keys N [--value B] [--cache B] [--threads T] [--seconds S] [--phases LIST]\n");
    return 2;
  }
  Options options;
  std::shared_ptr<Env> env_guard;
  if (!cfg.uri.empty()) {
    Env* env = nullptr;
    Status st = Env::CreateFromUri(ConfigOptions(), "", cfg.uri, &env, &env_guard);
    if (!st.ok()) {
      fprintf(stderr, "file system %s: %s\n", cfg.uri.c_str(), st.ToString().c_str());
      return 1;
    }
    options.env = env;
  }
  options.create_if_missing = true;
  options.compression = kNoCompression;
  options.max_background_jobs = 2;
  options.statistics = CreateDBStatistics();
  // On a kernel file system: reads and compactions past the page cache, so that the block
  // cache is the only cache (as on the plugin, which has no page cache).
  options.use_direct_reads = cfg.direct;
  options.use_direct_io_for_flush_and_compaction = cfg.direct;
  // What RocksDB sets itself with direct I/O; set for every setup alike.
  options.compaction_readahead_size = 2 << 20;
  BlockBasedTableOptions table;
  table.block_cache = NewLRUCache(cfg.cache);
  options.table_factory.reset(NewBlockBasedTableFactory(table));
  DB* db = nullptr;
  Status st = DB::Open(options, cfg.db, &db);
  if (!st.ok()) {
    fprintf(stderr, "open %s: %s\n", cfg.db.c_str(), st.ToString().c_str());
    return 1;
  }
  Shared s{db, &cfg, {cfg.keys}, {false}, {}};
  size_t start = 0;
  while (start <= cfg.phases.size()) {
    size_t end = cfg.phases.find(',', start);
    if (end == std::string::npos) end = cfg.phases.size();
    std::string phase = cfg.phases.substr(start, end - start);
    if (!phase.empty()) run_phase(s, phase);
    if (s.failed) {
      fprintf(stderr, "%s failed: %s\n", phase.c_str(), s.error.c_str());
      delete db;
      return 1;
    }
    start = end + 1;
  }
  auto* stats = options.statistics.get();
  printf("{\"rocksdb_flush_write_bytes\": %llu, \"rocksdb_compact_write_bytes\": %llu, \"rocksdb_wal_bytes\": %llu}\n",
         static_cast<unsigned long long>(stats->getTickerCount(FLUSH_WRITE_BYTES)),
         static_cast<unsigned long long>(stats->getTickerCount(COMPACT_WRITE_BYTES)),
         static_cast<unsigned long long>(stats->getTickerCount(WAL_FILE_BYTES)));
  st = db->Close();
  delete db;
  if (!st.ok()) {
    fprintf(stderr, "close: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
