// A RocksDB FileSystem that keeps a database's files on an append-only (AMF) volume of a
// SALSA pool, through libsalsa's file store (salsa_fs_*: each file in segments of its own,
// trimmed whole when the file is deleted; a journaled file table).
//
// Loading: the library registers the URI scheme `salsa://` with RocksDB's object registry when
// it is loaded, so unmodified tools use it by URI:
//
//   LD_PRELOAD=librocksdb_salsa.so db_bench --fs_uri=salsa://VOLUME@DEVICE ...
//   SALSA_FS_DEVICES='ssd:size=8G,file=/tmp/ssd.img;/dev/sdb' LD_PRELOAD=... ldb --fs_uri=salsa://VOLUME ...
//
// `@DEVICE` names one device (a path, or any device spec without `=` or `;`, which RocksDB's
// option parser would split); otherwise SALSA_FS_DEVICES lists the pool's devices, separated
// by `;`. The volume must exist (`salsa volume create POOL... NAME SIZE --controller amf`).
// Every `salsa://` file system of one process on the same devices shares one open pool, so
// several databases, each on its own volume, share a pool; the pool closes cleanly when the
// last of them is destroyed.
//
// What maps to what: a WritableFile is a file store writer (Append gathers and writes every
// MiB, Flush leaves the rest gathered as a page cache would, Sync/Fsync make the file durable,
// Close syncs); a directory's Fsync makes creates
// and renames durable; locks are held in memory (one process owns a pool). Positioned appends,
// reopening a file for append, truncation and links are not supported (RocksDB does not need
// them unless WAL recycling is turned on).
//
// Measurement: with SALSA_FS_REPORT=PATH set, the file system writes PATH when it is destroyed
// (at the process's exit, for db_bench): a JSON object with the pool's counters when it opened
// and when it closed (SALSA's bytes, each device model's flash programs and erasures, the
// volume's map memory) and the file store's statistics per file kind.

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/io_status.h>
#include <rocksdb/utilities/object_registry.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include "salsa.h"
}

namespace salsa_rocksdb {

using ROCKSDB_NAMESPACE::FileLock;
using ROCKSDB_NAMESPACE::FileOptions;
using ROCKSDB_NAMESPACE::FileSystem;
using ROCKSDB_NAMESPACE::FSDirectory;
using ROCKSDB_NAMESPACE::FSRandomAccessFile;
using ROCKSDB_NAMESPACE::FSSequentialFile;
using ROCKSDB_NAMESPACE::FSWritableFile;
using ROCKSDB_NAMESPACE::IODebugContext;
using ROCKSDB_NAMESPACE::IOOptions;
using ROCKSDB_NAMESPACE::IOStatus;
using ROCKSDB_NAMESPACE::ObjectLibrary;
using ROCKSDB_NAMESPACE::Slice;

// A negative errno from libsalsa as an IOStatus, with the library's message.
static IOStatus status_of(int rc, const std::string& what) {
  if (rc >= 0) return IOStatus::OK();
  std::string msg = what + ": " + salsa_last_error();
  switch (-rc) {
    case ENOENT:
      return IOStatus::PathNotFound(msg);
    case ENOSPC:
      return IOStatus::NoSpace(msg);
    case EINVAL:
      return IOStatus::InvalidArgument(msg);
    default:
      return IOStatus::IOError(msg);
  }
}

// One open pool, shared by every file system of the process on the same devices.
class Pool {
 public:
  explicit Pool(SalsaPool* pool) : pool_(pool) {}
  ~Pool() {
    if (salsa_pool_close(pool_) < 0) {
      fprintf(stderr, "salsa: closing the pool: %s\n", salsa_last_error());
    }
  }
  SalsaPool* get() const { return pool_; }

  // The open pool on `devices`, opening it when no file system holds it.
  static std::shared_ptr<Pool> open(const std::vector<std::string>& devices, std::string* err) {
    static std::mutex mu;
    static std::map<std::vector<std::string>, std::weak_ptr<Pool>> open_pools;
    std::lock_guard<std::mutex> lock(mu);
    if (auto p = open_pools[devices].lock()) return p;
    std::vector<const char*> specs;
    for (auto& d : devices) specs.push_back(d.c_str());
    SalsaPool* raw = nullptr;
    int rc = salsa_pool_open(specs.data(), specs.size(), &raw);
    if (rc < 0) {
      *err = std::string("opening the SALSA pool: ") + salsa_last_error();
      return nullptr;
    }
    auto p = std::make_shared<Pool>(raw);
    open_pools[devices] = p;
    return p;
  }

 private:
  SalsaPool* pool_;
};

class SequentialFile : public FSSequentialFile {
 public:
  explicit SequentialFile(SalsaFsReader* r) : r_(r) {}
  ~SequentialFile() override { salsa_fs_reader_free(r_); }
  IOStatus Read(size_t n, const IOOptions&, Slice* result, char* scratch, IODebugContext*) override {
    int64_t got = salsa_fs_read(r_, pos_, scratch, n);
    if (got < 0) return status_of(static_cast<int>(got), "read");
    pos_ += static_cast<uint64_t>(got);
    *result = Slice(scratch, static_cast<size_t>(got));
    return IOStatus::OK();
  }
  IOStatus Skip(uint64_t n) override {
    uint64_t size = salsa_fs_reader_size(r_);
    pos_ = (pos_ + n > size) ? size : pos_ + n;
    return IOStatus::OK();
  }

 private:
  SalsaFsReader* r_;
  uint64_t pos_ = 0;
};

class RandomAccessFile : public FSRandomAccessFile {
 public:
  explicit RandomAccessFile(SalsaFsReader* r) : r_(r) {}
  ~RandomAccessFile() override { salsa_fs_reader_free(r_); }
  IOStatus Read(uint64_t offset, size_t n, const IOOptions&, Slice* result, char* scratch,
                IODebugContext*) const override {
    int64_t got = salsa_fs_read(r_, offset, scratch, n);
    if (got < 0) return status_of(static_cast<int>(got), "read");
    *result = Slice(scratch, static_cast<size_t>(got));
    return IOStatus::OK();
  }

 private:
  SalsaFsReader* r_;
};

class WritableFile;

// The writers of one file system still alive. A program may exit without destroying its
// database (db_bench does), and what its writers hold in memory would then be lost where a
// kernel file system's page cache would have kept it: the file system closes them when it is
// destroyed at exit, and the store writes what they held.
struct OpenWriters {
  std::mutex mu;
  std::set<WritableFile*> live;
};

// The file store's writer takes one thread at a time; RocksDB may sync a WAL from one thread
// while another appends to it (SyncWAL), so every call holds the file's mutex.
class WritableFile : public FSWritableFile {
 public:
  WritableFile(SalsaFsWriter* w, const FileOptions& options, std::shared_ptr<OpenWriters> writers)
      : FSWritableFile(options), w_(w), writers_(std::move(writers)) {
    std::lock_guard<std::mutex> g(writers_->mu);
    writers_->live.insert(this);
  }
  ~WritableFile() override {
    {
      std::lock_guard<std::mutex> g(writers_->mu);
      writers_->live.erase(this);
    }
    close_once();
    salsa_fs_writer_free(w_);
  }
  // Closes the writer unless it was (what the file held stays with the store).
  int close_once() {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) return 0;
    closed_ = true;
    return salsa_fs_close(w_);
  }
  using FSWritableFile::Append;
  IOStatus Append(const Slice& data, const IOOptions&, IODebugContext*) override {
    std::lock_guard<std::mutex> g(mu_);
    return status_of(salsa_fs_append(w_, data.data(), data.size()), "append");
  }
  IOStatus Close(const IOOptions&, IODebugContext*) override { return status_of(close_once(), "close"); }
  // RocksDB's Flush hands what it buffered to the OS, which a kernel file system keeps in its
  // page cache; the writer keeps it likewise (the store writes past its memory budget, and a
  // sync, a read or the store's end writes the rest). Writing at every Flush put each WAL
  // record through the volume on its own (fillrandom at 0.39x ext4's rate in the first quick
  // run). Unlike the page cache, that memory is the process's: a crash of the process loses
  // what was not synced, as a power loss would.
  IOStatus Flush(const IOOptions&, IODebugContext*) override { return IOStatus::OK(); }
  IOStatus Sync(const IOOptions&, IODebugContext*) override {
    std::lock_guard<std::mutex> g(mu_);
    return status_of(salsa_fs_sync(w_), "sync");
  }
  IOStatus Fsync(const IOOptions&, IODebugContext*) override {
    std::lock_guard<std::mutex> g(mu_);
    return status_of(salsa_fs_sync(w_), "fsync");
  }
  uint64_t GetFileSize(const IOOptions&, IODebugContext*) override {
    std::lock_guard<std::mutex> g(mu_);
    return salsa_fs_writer_size(w_);
  }
  bool IsSyncThreadSafe() const override { return true; }

 private:
  std::mutex mu_;
  SalsaFsWriter* w_;
  std::shared_ptr<OpenWriters> writers_;
  bool closed_ = false;
};

class Directory : public FSDirectory {
 public:
  explicit Directory(SalsaFs* fs) : fs_(fs) {}
  IOStatus Fsync(const IOOptions&, IODebugContext*) override {
    return status_of(salsa_fs_sync_metadata(fs_), "directory fsync");
  }

 private:
  SalsaFs* fs_;
};

class Lock : public FileLock {
 public:
  explicit Lock(std::string name) : name(std::move(name)) {}
  std::string name;
};

// The pool's counters as a JSON object's members.
static std::string counters_json(SalsaPool* pool) {
  std::string out;
  salsa_pool_counters(
      pool,
      [](const char* name, uint64_t value, void* context) {
        auto* o = static_cast<std::string*>(context);
        char buf[64];
        snprintf(buf, sizeof buf, "%" PRIu64, value);
        *o += (o->empty() ? "\"" : ", \"") + std::string(name) + "\": " + buf;
      },
      &out);
  return "{" + out + "}";
}

static std::string kind_json(const SalsaFsKindStats& k) {
  char buf[256];
  snprintf(buf, sizeof buf,
           "{\"files\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"segments\": %" PRIu64 ", \"segments_trimmed\": %" PRIu64 "}",
           k.files, k.bytes, k.segments, k.segments_trimmed);
  return buf;
}

class SalsaFileSystem : public FileSystem {
 public:
  SalsaFileSystem(std::shared_ptr<Pool> pool, SalsaFs* fs, std::string uri)
      : pool_(std::move(pool)), fs_(fs), uri_(std::move(uri)) {
    if (const char* path = std::getenv("SALSA_FS_REPORT")) {
      report_path_ = path;
      at_open_ = counters_json(pool_->get());
    }
  }
  ~SalsaFileSystem() override {
    {
      std::lock_guard<std::mutex> g(writers_->mu);
      for (WritableFile* w : writers_->live) w->close_once();
    }
    if (!report_path_.empty()) write_report();
    salsa_fs_free(fs_);
  }

  void write_report() {
    SalsaFsStats st{};
    salsa_fs_stats(fs_, &st);
    std::string json = "{\"uri\": \"" + uri_ + "\", \"at_open\": " + at_open_ + ", \"at_close\": " +
                       counters_json(pool_->get()) + ", \"files\": {\"wal\": " + kind_json(st.wal) +
                       ", \"sst\": " + kind_json(st.sst) + ", \"manifest\": " + kind_json(st.manifest) +
                       ", \"other\": " + kind_json(st.other) + "}}\n";
    if (FILE* f = fopen(report_path_.c_str(), "w")) {
      fputs(json.c_str(), f);
      fclose(f);
    } else {
      fprintf(stderr, "salsa: cannot write the report %s\n", report_path_.c_str());
    }
  }

  static const char* kClassName() { return "SalsaFileSystem"; }
  const char* Name() const override { return kClassName(); }

  IOStatus NewSequentialFile(const std::string& fname, const FileOptions&, std::unique_ptr<FSSequentialFile>* result,
                             IODebugContext*) override {
    SalsaFsReader* r = nullptr;
    int rc = salsa_fs_open_reader(fs_, fname.c_str(), &r);
    if (rc < 0) return status_of(rc, fname);
    result->reset(new SequentialFile(r));
    return IOStatus::OK();
  }

  IOStatus NewRandomAccessFile(const std::string& fname, const FileOptions&,
                               std::unique_ptr<FSRandomAccessFile>* result, IODebugContext*) override {
    SalsaFsReader* r = nullptr;
    int rc = salsa_fs_open_reader(fs_, fname.c_str(), &r);
    if (rc < 0) return status_of(rc, fname);
    result->reset(new RandomAccessFile(r));
    return IOStatus::OK();
  }

  IOStatus NewWritableFile(const std::string& fname, const FileOptions& options,
                           std::unique_ptr<FSWritableFile>* result, IODebugContext*) override {
    SalsaFsWriter* w = nullptr;
    int rc = salsa_fs_create(fs_, fname.c_str(), &w);
    if (rc < 0) return status_of(rc, fname);
    result->reset(new WritableFile(w, options, writers_));
    return IOStatus::OK();
  }

  IOStatus NewDirectory(const std::string&, const IOOptions&, std::unique_ptr<FSDirectory>* result,
                        IODebugContext*) override {
    result->reset(new Directory(fs_));
    return IOStatus::OK();
  }

  IOStatus FileExists(const std::string& fname, const IOOptions&, IODebugContext*) override {
    int rc = salsa_fs_exists(fs_, fname.c_str());
    if (rc < 0) return status_of(rc, fname);
    return rc > 0 ? IOStatus::OK() : IOStatus::NotFound(fname);
  }

  IOStatus GetChildren(const std::string& dir, const IOOptions&, std::vector<std::string>* result,
                       IODebugContext*) override {
    result->clear();
    int rc = salsa_fs_exists(fs_, dir.c_str());
    if (rc < 0) return status_of(rc, dir);
    if (rc == 0) return IOStatus::PathNotFound(dir);
    rc = salsa_fs_children(
        fs_, dir.c_str(),
        [](const char* name, void* context) { static_cast<std::vector<std::string>*>(context)->push_back(name); },
        result);
    return status_of(rc, dir);
  }

  IOStatus DeleteFile(const std::string& fname, const IOOptions&, IODebugContext*) override {
    return status_of(salsa_fs_delete(fs_, fname.c_str()), fname);
  }

  IOStatus CreateDir(const std::string& dirname, const IOOptions&, IODebugContext*) override {
    if (salsa_fs_exists(fs_, dirname.c_str()) > 0) return IOStatus::IOError(dirname + ": exists");
    return status_of(salsa_fs_create_dir(fs_, dirname.c_str()), dirname);
  }

  IOStatus CreateDirIfMissing(const std::string& dirname, const IOOptions&, IODebugContext*) override {
    return status_of(salsa_fs_create_dir(fs_, dirname.c_str()), dirname);
  }

  IOStatus DeleteDir(const std::string& dirname, const IOOptions&, IODebugContext*) override {
    return status_of(salsa_fs_delete_dir(fs_, dirname.c_str()), dirname);
  }

  IOStatus GetFileSize(const std::string& fname, const IOOptions&, uint64_t* size, IODebugContext*) override {
    return status_of(salsa_fs_stat(fs_, fname.c_str(), size, nullptr), fname);
  }

  IOStatus GetFileModificationTime(const std::string& fname, const IOOptions&, uint64_t* mtime,
                                   IODebugContext*) override {
    return status_of(salsa_fs_stat(fs_, fname.c_str(), nullptr, mtime), fname);
  }

  IOStatus RenameFile(const std::string& src, const std::string& target, const IOOptions&,
                      IODebugContext*) override {
    return status_of(salsa_fs_rename(fs_, src.c_str(), target.c_str()), src);
  }

  IOStatus LockFile(const std::string& fname, const IOOptions&, FileLock** lock, IODebugContext*) override {
    std::lock_guard<std::mutex> g(locks_mu_);
    if (!locks_.insert(fname).second) return IOStatus::IOError(fname + ": locked by this process already");
    *lock = new Lock(fname);
    return IOStatus::OK();
  }

  IOStatus UnlockFile(FileLock* lock, const IOOptions&, IODebugContext*) override {
    auto* l = static_cast<Lock*>(lock);
    {
      std::lock_guard<std::mutex> g(locks_mu_);
      locks_.erase(l->name);
    }
    delete l;
    return IOStatus::OK();
  }

  IOStatus GetTestDirectory(const IOOptions&, std::string* path, IODebugContext*) override {
    *path = "rocksdbtest";
    return status_of(salsa_fs_create_dir(fs_, path->c_str()), *path);
  }

  IOStatus GetAbsolutePath(const std::string& db_path, const IOOptions&, std::string* output_path,
                           IODebugContext*) override {
    *output_path = db_path;
    return IOStatus::OK();
  }

  IOStatus IsDirectory(const std::string& path, const IOOptions&, bool* is_dir, IODebugContext*) override {
    int rc = salsa_fs_exists(fs_, path.c_str());
    if (rc < 0) return status_of(rc, path);
    if (rc == 0) return IOStatus::NotFound(path);
    *is_dir = rc == 2;
    return IOStatus::OK();
  }

 private:
  std::shared_ptr<Pool> pool_;
  SalsaFs* fs_;
  std::string uri_;
  std::string report_path_;
  std::string at_open_;
  std::mutex locks_mu_;
  std::set<std::string> locks_;
  std::shared_ptr<OpenWriters> writers_ = std::make_shared<OpenWriters>();
};

// Splits `text` at `sep`, dropping empty parts.
static std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Builds the file system a `salsa://VOLUME[@DEVICE]` URI names; nullptr with `errmsg` set when
// it cannot.
static FileSystem* make(const std::string& uri, std::unique_ptr<FileSystem>* guard, std::string* errmsg) {
  const std::string scheme = "salsa://";
  std::string rest = uri.substr(uri.rfind(scheme, 0) == 0 ? scheme.size() : 0);
  std::string volume = rest;
  std::vector<std::string> devices;
  size_t at = rest.find('@');
  if (at != std::string::npos) {
    volume = rest.substr(0, at);
    devices.push_back(rest.substr(at + 1));
  } else if (const char* env = std::getenv("SALSA_FS_DEVICES")) {
    devices = split(env, ';');
  }
  if (volume.empty() || devices.empty()) {
    *errmsg = "salsa: use salsa://VOLUME@DEVICE, or salsa://VOLUME with SALSA_FS_DEVICES naming the pool's devices";
    return nullptr;
  }
  auto pool = Pool::open(devices, errmsg);
  if (!pool) return nullptr;
  SalsaFs* fs = nullptr;
  if (salsa_fs_open(pool->get(), volume.c_str(), &fs) < 0) {
    *errmsg = std::string("salsa: opening the file store on volume ") + volume + ": " + salsa_last_error();
    return nullptr;
  }
  guard->reset(new SalsaFileSystem(pool, fs, uri));
  return guard->get();
}

// Registers `salsa://` when the library is loaded.
static const bool registered = [] {
  ObjectLibrary::Default()->AddFactory<FileSystem>(
      ObjectLibrary::PatternEntry("salsa", false).AddSeparator("://", false), make);
  return true;
}();

}  // namespace salsa_rocksdb
