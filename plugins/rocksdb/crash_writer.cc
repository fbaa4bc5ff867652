// The writer and checker of the RocksDB crash test (crates/salsa-files/tests/rocksdb.rs).
//
//   crash_writer write URI DB FIRST   writes keys FIRST, FIRST+1, ... with sync=true (every
//                                     seventh with a WAL flush instead, then synced in a
//                                     batch), printing each key's number once its write
//                                     returned durable; runs until killed
//   crash_writer check URI DB N       opens the database and checks that keys 0..N-1 are all
//                                     there with their values; prints how many keys it holds
//
// The value of key i is derived from i alone, so the checker needs no other record. Exit 0
// when every check passes, 1 with a message otherwise.

#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/options.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

using namespace ROCKSDB_NAMESPACE;

static std::string key_of(long i) {
  char buf[32];
  snprintf(buf, sizeof buf, "key%012ld", i);
  return buf;
}

static std::string value_of(long i) {
  std::string v;
  // 1 KiB to 8 KiB, so that table files fill and compactions run.
  size_t len = 1024 + static_cast<size_t>((i * 2654435761u) % 7168);
  v.reserve(len);
  for (size_t j = 0; j < len; j++) v.push_back(static_cast<char>('a' + (i + j * 7) % 26));
  return v;
}

static int fail(const std::string& what, const Status& s) {
  fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s write|check URI DB NUMBER\n", argv[0]);
    return 2;
  }
  std::string mode = argv[1], uri = argv[2], path = argv[3];
  long number = atol(argv[4]);
  std::shared_ptr<Env> env_guard;
  Env* env = nullptr;
  ConfigOptions config;
  Status s = Env::CreateFromUri(config, "", uri, &env, &env_guard);
  if (!s.ok()) return fail("file system " + uri, s);
  Options options;
  options.env = env;
  options.create_if_missing = true;
  options.write_buffer_size = 1 << 20;
  options.target_file_size_base = 2 << 20;
  options.max_bytes_for_level_base = 8 << 20;
  options.compression = kNoCompression;
  DB* raw = nullptr;
  s = DB::Open(options, path, &raw);
  if (!s.ok()) return fail("open " + path, s);
  std::unique_ptr<DB> db(raw);
  if (mode == "write") {
    WriteOptions synced;
    synced.sync = true;
    WriteOptions unsynced;
    for (long i = number;; i++) {
      bool batch_end = i % 7 == 6;
      s = db->Put(i % 7 == 5 ? unsynced : synced, key_of(i), value_of(i));
      if (!s.ok()) return fail("put " + key_of(i), s);
      if (i % 7 == 5) continue;  // acknowledged with the next synced write
      if (batch_end) {
        s = db->FlushWAL(true);
        if (!s.ok()) return fail("flush wal", s);
        printf("%ld\n%ld\n", i - 1, i);
      } else {
        printf("%ld\n", i);
      }
      fflush(stdout);
    }
  }
  if (mode == "check") {
    for (long i = 0; i < number; i++) {
      std::string got;
      s = db->Get(ReadOptions(), key_of(i), &got);
      if (!s.ok()) return fail("acknowledged key " + key_of(i), s);
      if (got != value_of(i)) {
        fprintf(stderr, "key %s holds %zu bytes, not its value\n", key_of(i).c_str(), got.size());
        return 1;
      }
    }
    long held = 0;
    std::unique_ptr<Iterator> it(db->NewIterator(ReadOptions()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) held++;
    if (!it->status().ok()) return fail("scan", it->status());
    printf("%ld\n", held);
    return 0;
  }
  fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
