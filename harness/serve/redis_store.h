#pragma once
// A Redis remote tier for KV blocks (what LMCache calls its remote backend on a redis:// URL):
// RedisStore holds one blocking hiredis connection and moves blocks as binary values,
// LocalRedisServer runs a private redis-server for one process (tests, and runs that ask for a
// local remote tier), and measure_redis_bandwidth times put/get round trips through a store.
// Torch-free: blocks arrive as bytes.
//
// Not thread-safe: a RedisStore is one connection; give each thread its own.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct redisContext;
struct redisReply;
struct iovec;

namespace kvb {

// The largest value put() accepts: Redis' default proto-max-bulk-len (512mb). A larger SET would be
// rejected by the server only after the whole value had crossed the wire, so it is refused up
// front; callers split blocks instead of relying on chunking here.
inline constexpr size_t kRedisMaxValueBytes = size_t{512} << 20;

// A Redis URL taken apart: "redis://HOST:PORT" (HOST may be a bracketed IPv6 address) or
// "unix:///path/to/socket".
struct RedisUrl {
  bool is_unix = false;
  std::string host;  // TCP host, or the socket path
  int port = 0;      // TCP only
};
// Throws kvb::Error naming the URL and what is wrong with it; connects to nothing, so a config can
// be checked before anything runs.
RedisUrl parse_redis_url(const std::string& url);

// A connection to a Redis server holding KV blocks as binary values. url: "redis://HOST:PORT"
// (HOST may be a bracketed IPv6 address) or "unix:///path/to/socket". timeout_ms bounds connecting
// and every socket read/write. Every failure throws kvb::Error naming the URL (and the key, for
// per-key operations) and carrying the server's or the socket's error text. After an I/O error the
// connection is dropped and the next call reconnects, so one timeout does not poison the store.
// put() and get() move the value between the caller's memory and the socket directly; hiredis
// handles everything else.
class RedisStore {
 public:
  // Throws kvb::Error naming the URL if it is malformed or nothing answers PING there.
  explicit RedisStore(const std::string& url, int timeout_ms = 5000);
  ~RedisStore();
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  // SET key value, binary-safe for both. Throws for values above kRedisMaxValueBytes and for
  // server errors (e.g. OOM under maxmemory with noeviction).
  void put(const std::string& key, const void* data, size_t bytes);
  // GET key into *out (replaced). Returns false, with *out cleared, when the key does not exist.
  // A value longer than max_bytes (what the caller put there) is refused before anything is
  // allocated for it, naming the key; the connection is dropped, as after any protocol error.
  bool get(const std::string& key, std::vector<uint8_t>* out,
           size_t max_bytes = kRedisMaxValueBytes);
  // DEL key. Returns true when the key existed.
  bool remove(const std::string& key);
  // INFO memory's used_memory: what the server's allocator holds, all keys and overheads included.
  int64_t used_memory_bytes();
  // FLUSHDB: removes every key of the connection's database (not only ours).
  void flush();

  const std::string& url() const { return url_; }

 private:
  struct ReplyDeleter {
    void operator()(redisReply* reply) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

  void connect();
  void disconnect() noexcept;
  // Runs one command (argv form, so keys and values are binary-safe) and returns its reply, never
  // an error reply: those, and failed I/O, throw with `what` (e.g. "SET key 'k' (1024 bytes)") in
  // the message. Reconnects first if an earlier I/O error dropped the connection.
  Reply command(const std::string& what, int argc, const char** argv, const size_t* argv_len);
  // The checks of command() on a reply hiredis produced (NULL when its I/O failed).
  Reply checked(const std::string& what, redisReply* raw);
  // Block values bypass hiredis' buffers, which copy a value twice on the way out and twice on the
  // way in, each into a fresh page-faulting allocation: through hiredis a 64 MiB put took ~160 ms
  // and a get ~260-380 ms on loopback, directly ~36 ms each.
  // Both drop the connection and throw, naming `what`, on any socket error or timeout.
  void send_all(const std::string& what, ::iovec* iov, int iov_count);
  size_t recv_some(const std::string& what, void* buf, size_t bytes);
  [[noreturn]] void fail_io(const std::string& what, const std::string& why);

  std::string url_;
  int timeout_ms_ = 0;
  bool is_unix_ = false;
  std::string host_;  // TCP host, or the socket path for unix:// URLs
  int port_ = 0;
  redisContext* ctx_ = nullptr;
};

// A private redis-server for one process: started on a unix socket in a fresh temp directory with
// persistence off and no TCP port, waited for until it answers PING (about 5 s), stopped (SIGTERM,
// then SIGKILL if it lingers; always reaped) and its directory removed in the destructor. With
// maxmemory_bytes > 0 the server refuses writes beyond it (maxmemory-policy noeviction): a remote
// tier must not silently drop blocks. Throws kvb::Error if redis-server is not on PATH or does not
// come up, with the tail of its log. If this process is killed (SIGKILL) no destructor runs: the
// server and its $TMPDIR/kvb_redis_* directory are left behind.
class LocalRedisServer {
 public:
  explicit LocalRedisServer(int64_t maxmemory_bytes = 0);  // 0: no limit
  ~LocalRedisServer();
  LocalRedisServer(const LocalRedisServer&) = delete;
  LocalRedisServer& operator=(const LocalRedisServer&) = delete;

  std::string url() const { return "unix://" + socket_path_; }  // "unix:///tmp/.../redis.sock"
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  static bool available();  // redis-server on PATH

 private:
  void stop() noexcept;
  std::string log_tail() const;

  std::string dir_;
  std::string socket_path_;
  std::string log_path_;
  pid_t pid_ = -1;
};

// What measure_redis_bandwidth found. GB/s are 1e9 bytes/s of value payload over the summed time of
// the put (or get) calls alone: generating and checking the data is not counted.
struct RedisBandwidth {
  int64_t value_bytes = 0, repeats = 0;
  double put_gbps = 0, get_gbps = 0;
  double put_ms_p50 = 0, get_ms_p50 = 0;  // per-value latency medians
};

// `repeats` puts of value_bytes-sized random blocks (never all-zero; each distinct from the others
// where value_bytes > 8) under distinct fresh keys, then `repeats` gets of them, each checked byte
// for byte against what was put (kvb::Error on a mismatch or a missing key). The keys are removed
// afterwards, also when a check fails. Values exist one at a time on the client side, but the
// server holds all `repeats` of them at once.
RedisBandwidth measure_redis_bandwidth(RedisStore& store, int64_t value_bytes, int repeats,
                                       uint64_t seed);

}  // namespace kvb
