// RedisStore / LocalRedisServer / measure_redis_bandwidth against a real redis-server on a private
// unix socket (reached directly, or through a fault-injecting proxy on an ephemeral loopback TCP
// port), plus fake servers for replies a real one would not send. Tests that need redis-server
// skip, saying so, where it is not installed; no fixed port is listened on and no server is
// shared with other processes, so the file runs in parallel with anything.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#ifndef KVB_NO_HIREDIS
#include <hiredis/hiredis.h>
#endif
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness/common/error.h"
#include "harness/serve/redis_store.h"

#ifdef KVB_NO_HIREDIS
TEST(RedisStore, NotBuilt) { GTEST_SKIP() << "built without hiredis (KVB_NO_HIREDIS)"; }
#else
namespace kvb {
namespace {

#define SKIP_WITHOUT_REDIS()                                                        \
  do {                                                                              \
    if (!LocalRedisServer::available())                                             \
      GTEST_SKIP() << "redis-server is not on PATH (scripts/setup.sh installs it)"; \
  } while (0)

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t w = rng();
    std::memcpy(v.data() + i, &w, std::min<size_t>(8, n - i));
  }
  return v;
}

// The message of the kvb::Error that `fn` throws, or a failure when it throws nothing.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a kvb::Error";
  return "";
}

bool path_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

int listen_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 4) != 0) {
    ADD_FAILURE() << "cannot listen on " << path << ": " << std::strerror(errno);
  }
  return fd;
}

int connect_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "cannot connect to " << path << ": " << std::strerror(errno);
  }
  return fd;
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// What a FaultyProxy does to the traffic it forwards.
struct ProxyFaults {
  int64_t flip_at = -1;      // server-to-client byte offset whose lowest bit is flipped; -1: none
  int64_t pause_after = -1;  // client-to-server bytes forwarded before one pause; -1: none
  int pause_ms = 0;
};

// A proxy on TCP loopback (so redis:// URLs get a real server too) in front of a redis-server's
// unix socket, for one client connection. Flipping a bit of a reply stands for a store that
// silently corrupts a value (measure_redis_bandwidth must notice); pausing the upstream makes a
// large SET's send time out part way, so the store's resend of the remainder is exercised. That
// needs TCP: a TCP send's timeout bounds the whole call, a unix socket's only restarts it.
class FaultyProxy {
 public:
  FaultyProxy(const std::string& upstream_path, ProxyFaults faults) : faults_(faults) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    // A small receive buffer (inherited by the accepted socket) so that a pause stalls the sender
    // instead of being absorbed by auto-tuned buffers.
    const int rcvbuf = 64 << 10;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 4) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1: " << std::strerror(errno);
    }
    port_ = ntohs(addr.sin_port);
    if (::pipe(wake_) != 0) ADD_FAILURE() << "pipe failed";
    thread_ = std::thread([this, upstream_path] { run(upstream_path); });
  }
  ~FaultyProxy() {
    const char c = 0;
    if (::write(wake_[1], &c, 1) != 1) ADD_FAILURE() << "cannot wake the proxy thread";
    thread_.join();
    for (int fd : {listen_fd_, wake_[0], wake_[1]}) ::close(fd);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  void run(const std::string& upstream_path) {
    pollfd accept_set[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(accept_set, 2, -1) <= 0 || (accept_set[1].revents & POLLIN)) return;
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    const int server = connect_unix(upstream_path);
    int64_t to_client = 0, to_server = 0;
    bool paused = false;
    std::vector<char> buf(1 << 16);
    for (bool open = true; open;) {
      pollfd fds[3] = {{client, POLLIN, 0}, {server, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (::poll(fds, 3, -1) <= 0 || fds[2].revents != 0) break;
      for (int side = 0; side < 2 && open; ++side) {
        if (fds[side].revents == 0) continue;
        const ssize_t n = ::read(fds[side].fd, buf.data(), buf.size());
        if (n <= 0) {
          open = false;
          break;
        }
        if (side == 1) {  // server -> client
          const int64_t at = faults_.flip_at;
          if (at >= to_client && at < to_client + n) buf[at - to_client] ^= 1;
          to_client += n;
        } else {
          to_server += n;
          if (!paused && faults_.pause_after >= 0 && to_server >= faults_.pause_after) {
            paused = true;
            std::this_thread::sleep_for(std::chrono::milliseconds(faults_.pause_ms));
          }
        }
        open = write_all(side == 0 ? server : client, buf.data(), static_cast<size_t>(n));
      }
    }
    ::close(client);
    ::close(server);
  }

  int port_ = 0;
  ProxyFaults faults_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

// A fake server on a unix socket for one connection: for each scripted reply it reads one request
// and writes the reply verbatim, then holds the connection open, silent, until destroyed. Shows
// how the store copes with replies a real server would not send (or would send too slowly).
class ScriptedServer {
 public:
  ScriptedServer(const std::string& dir, std::vector<std::string> replies)
      : path_(dir + "/scripted.sock"), replies_(std::move(replies)) {
    listen_fd_ = listen_unix(path_);
    if (::pipe(wake_) != 0) ADD_FAILURE() << "pipe failed";
    thread_ = std::thread([this] { run(); });
  }
  ~ScriptedServer() {
    const char c = 0;
    if (::write(wake_[1], &c, 1) != 1) ADD_FAILURE() << "cannot wake the scripted server";
    thread_.join();
    for (int fd : {listen_fd_, wake_[0], wake_[1]}) ::close(fd);
    ::unlink(path_.c_str());
  }
  std::string url() const { return "unix://" + path_; }

 private:
  void run() {
    pollfd accept_set[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(accept_set, 2, -1) <= 0 || (accept_set[1].revents & POLLIN)) return;
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    std::vector<char> buf(1 << 16);
    for (const std::string& reply : replies_) {
      pollfd fds[2] = {{client, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) <= 0 || fds[1].revents != 0) break;
      if (::read(client, buf.data(), buf.size()) <= 0) break;
      if (!write_all(client, reply.data(), reply.size())) break;
    }
    pollfd wait_wake = {wake_[0], POLLIN, 0};
    ::poll(&wait_wake, 1, -1);
    ::close(client);
  }

  std::string path_;
  std::vector<std::string> replies_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

// A fresh short-named directory for fake servers' sockets, removed with its contents at the end.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = "/tmp/kvb_redis_test_XXXXXX";  // short: socket paths hold ~107 bytes
    if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One server for the tests that only need a clean database; each test flushes it first.
class RedisStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (LocalRedisServer::available()) server_ = std::make_unique<LocalRedisServer>();
  }
  static void TearDownTestSuite() { server_.reset(); }
  void SetUp() override {
    SKIP_WITHOUT_REDIS();
    store_ = std::make_unique<RedisStore>(server_->url());
    store_->flush();
  }

  static std::unique_ptr<LocalRedisServer> server_;
  std::unique_ptr<RedisStore> store_;
};
std::unique_ptr<LocalRedisServer> RedisStoreTest::server_;

TEST_F(RedisStoreTest, RoundTripsBinaryValuesOfManySizes) {
  // Zero bytes inside the value (and the key) would be cut short by any strlen on the way.
  const std::string binary("a\0b\0\0\xff\x80z\0", 9);
  store_->put(std::string("bin\0key", 7), binary.data(), binary.size());
  std::vector<uint8_t> got;
  ASSERT_TRUE(store_->get(std::string("bin\0key", 7), &got));
  EXPECT_EQ(std::string(got.begin(), got.end()), binary);
  EXPECT_FALSE(store_->get("bin", &got)) << "the key must not be cut at its zero byte";
  EXPECT_TRUE(got.empty());

  for (size_t n : {size_t{1}, size_t{1} << 20, size_t{64} << 20}) {
    const std::vector<uint8_t> value = random_bytes(n, 1000 + n);
    const std::string key = "blk:" + std::to_string(n);
    store_->put(key, value.data(), value.size());
    ASSERT_TRUE(store_->get(key, &got)) << n;
    ASSERT_EQ(got.size(), n);
    EXPECT_TRUE(got == value) << "value of " << n << " bytes came back different";
  }

  // An empty value is a value, not a missing key.
  store_->put("empty", nullptr, 0);
  ASSERT_TRUE(store_->get("empty", &got));
  EXPECT_TRUE(got.empty());
}

TEST_F(RedisStoreTest, MissingRemoveAndFlush) {
  std::vector<uint8_t> got = {1, 2, 3};
  EXPECT_FALSE(store_->get("never-put", &got));
  EXPECT_TRUE(got.empty()) << "a miss must not leave stale bytes behind";

  const uint8_t v[] = {0, 7, 0};
  store_->put("k", v, sizeof(v));
  EXPECT_TRUE(store_->remove("k"));
  EXPECT_FALSE(store_->remove("k"));
  EXPECT_FALSE(store_->get("k", &got));

  // Overwrite replaces the whole value.
  store_->put("k", v, sizeof(v));
  store_->put("k", v, 1);
  ASSERT_TRUE(store_->get("k", &got));
  EXPECT_EQ(got, std::vector<uint8_t>({0}));

  for (int i = 0; i < 5; ++i) store_->put("f" + std::to_string(i), v, sizeof(v));
  store_->flush();
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(store_->get("f" + std::to_string(i), &got)) << i;
  EXPECT_FALSE(store_->get("k", &got));
}

TEST_F(RedisStoreTest, UsedMemoryGrowsByTheValue) {
  const int64_t before = store_->used_memory_bytes();
  EXPECT_GT(before, 0);
  const size_t n = size_t{16} << 20;
  const std::vector<uint8_t> value = random_bytes(n, 16);
  store_->put("big", value.data(), n);
  const int64_t after = store_->used_memory_bytes();
  EXPECT_GE(after - before, static_cast<int64_t>(n)) << "before " << before << " after " << after;
  ASSERT_TRUE(store_->remove("big"));
  EXPECT_LT(store_->used_memory_bytes(), after - static_cast<int64_t>(n) / 2);
}

TEST_F(RedisStoreTest, RejectsValuesAboveProtoMaxBulkLenNamingKeyAndSize) {
  const uint8_t byte = 1;
  // Never read: the size check comes before anything is sent.
  const size_t too_big = kRedisMaxValueBytes + 1;
  const std::string msg = error_of([&] { store_->put("huge-block", &byte, too_big); });
  EXPECT_NE(msg.find("huge-block"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(too_big)), std::string::npos) << msg;
  EXPECT_NE(msg.find(server_->url()), std::string::npos) << msg;
  // And the connection is still fine.
  store_->put("after", &byte, 1);
  std::vector<uint8_t> got;
  EXPECT_TRUE(store_->get("after", &got));
}

TEST_F(RedisStoreTest, BandwidthIsPositiveFiniteAndCleansUp) {
  const int64_t before = store_->used_memory_bytes();
  for (uint64_t seed : {1u, 2u}) {
    const RedisBandwidth bw = measure_redis_bandwidth(*store_, int64_t{1} << 20, 8, seed);
    EXPECT_EQ(bw.value_bytes, int64_t{1} << 20);
    EXPECT_EQ(bw.repeats, 8);
    for (double x : {bw.put_gbps, bw.get_gbps, bw.put_ms_p50, bw.get_ms_p50}) {
      EXPECT_TRUE(std::isfinite(x)) << x;
      EXPECT_GT(x, 0) << x;
    }
    // Total time is at least 8 medians' worth of the faster half: GB/s and latency must agree.
    EXPECT_LE(bw.put_gbps, 2.0 * (1 << 20) / (bw.put_ms_p50 * 1e-3) / 1e9);
    EXPECT_LE(bw.get_gbps, 2.0 * (1 << 20) / (bw.get_ms_p50 * 1e-3) / 1e9);
  }
  // 8 MiB were stored per run; the keys must be gone.
  EXPECT_LT(store_->used_memory_bytes(), before + (int64_t{2} << 20));
  // A value that is not in this very database cannot have passed the check: a key written
  // elsewhere with the same name stays untouched (the measurement uses fresh keys).
  const uint8_t mine[] = {42};
  store_->put("kvb:bw:0:0", mine, 1);
  measure_redis_bandwidth(*store_, 1000, 3, 0);
  std::vector<uint8_t> got;
  ASSERT_TRUE(store_->get("kvb:bw:0:0", &got));
  EXPECT_EQ(got, std::vector<uint8_t>({42}));

  EXPECT_THROW(measure_redis_bandwidth(*store_, 0, 8, 1), Error);
  EXPECT_THROW(measure_redis_bandwidth(*store_, 1024, 0, 1), Error);
}

TEST_F(RedisStoreTest, BandwidthChecksEveryByteThatComesBack) {
  // Server-to-client bytes before the first GET payload: "+PONG\r\n" (7), 8 x "+OK\r\n" (40),
  // then the bulk header "$1048576\r\n" (10). The flip lands on payload byte 12345 of key 0.
  const int64_t kPayloadByte = 12345;
  {
    ProxyFaults faults;
    faults.flip_at = 7 + 40 + 10 + kPayloadByte;
    FaultyProxy proxy(server_->url().substr(7), faults);
    RedisStore through_proxy(proxy.url());
    const std::string msg =
        error_of([&] { measure_redis_bandwidth(through_proxy, int64_t{1} << 20, 8, 3); });
    EXPECT_NE(msg.find("first at byte " + std::to_string(kPayloadByte)), std::string::npos) << msg;
    EXPECT_NE(msg.find(proxy.url()), std::string::npos) << msg;
  }
  // The failed run removed its keys all the same.
  EXPECT_LT(store_->used_memory_bytes(), int64_t{4} << 20);
}

TEST_F(RedisStoreTest, SendThatTimesOutPartWayResumesWhereItStopped) {
  // The upstream stalls for 1.5 timeouts after 1 MiB of a 16 MiB SET (more than loopback TCP
  // buffers hold): one sendmsg returns having sent only part of the value, and the next must
  // continue from exactly there.
  ProxyFaults faults;
  faults.pause_after = 1 << 20;
  faults.pause_ms = 300;
  FaultyProxy proxy(server_->url().substr(7), faults);
  RedisStore slow(proxy.url(), 200);
  const std::vector<uint8_t> value = random_bytes(size_t{16} << 20, 44);
  slow.put("resumed", value.data(), value.size());
  std::vector<uint8_t> got;
  ASSERT_TRUE(store_->get("resumed", &got));
  EXPECT_TRUE(got == value) << "the value arrived different (" << got.size() << " bytes)";
}

TEST_F(RedisStoreTest, ServerErrorOnGetIsSurfacedAndTheConnectionStaysUsable) {
  // A key holding a list: GET answers -WRONGTYPE. Made through a second connection with raw
  // commands, since RedisStore only writes strings.
  redisContext* c = redisConnectUnix(server_->url().substr(7).c_str());
  ASSERT_TRUE(c != nullptr && c->err == 0);
  freeReplyObject(redisCommand(c, "DEL list-or-not"));
  freeReplyObject(redisCommand(c, "RPUSH list-or-not a"));
  redisFree(c);

  std::vector<uint8_t> got;
  const std::string msg = error_of([&] { store_->get("list-or-not", &got); });
  EXPECT_NE(msg.find("WRONGTYPE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'list-or-not'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(server_->url()), std::string::npos) << msg;
  const uint8_t v[] = {0, 1};
  store_->put("fine", v, 2);
  ASSERT_TRUE(store_->get("fine", &got));
  EXPECT_EQ(got, std::vector<uint8_t>({0, 1}));
}

TEST(RedisStoreFaults, StalledValueTimesOutNamingTheKey) {
  ScratchDir dir;  // a fake server: runs without redis-server
  // PONG, then a value announced as 100 bytes of which 3 ever arrive.
  ScriptedServer fake(dir.path(), {"+PONG\r\n", "$100\r\nabc"});
  RedisStore store(fake.url(), 300);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<uint8_t> got;
  const std::string msg = error_of([&] { store.get("slow-key", &got); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'slow-key'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fake.url()), std::string::npos) << msg;
}

TEST(RedisStoreFaults, UnexpectedRepliesThrowInsteadOfMisreading) {
  ScratchDir dir;  // fake servers: runs without redis-server
  {
    ScriptedServer fake(dir.path(), {"+PONG\r\n", ":5\r\n"});
    RedisStore store(fake.url(), 300);
    std::vector<uint8_t> got;
    const std::string msg = error_of([&] { store.get("int-key", &got); });
    EXPECT_NE(msg.find("'int-key'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a string"), std::string::npos) << msg;
  }
  {
    // A value whose trailing CRLF is wrong: the framing is lost, so the value must not be used.
    ScriptedServer fake(dir.path(), {"+PONG\r\n", "$3\r\nabcXY"});
    RedisStore store(fake.url(), 300);
    std::vector<uint8_t> got;
    const std::string msg = error_of([&] { store.get("crlf-key", &got); });
    EXPECT_NE(msg.find("CRLF"), std::string::npos) << msg;
  }
  {
    // SET answered with something other than +OK.
    ScriptedServer fake(dir.path(), {"+PONG\r\n", "+QUEUED\r\n"});
    RedisStore store(fake.url(), 300);
    const uint8_t v[] = {1};
    const std::string msg = error_of([&] { store.put("set-key", v, 1); });
    EXPECT_NE(msg.find("QUEUED"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'set-key'"), std::string::npos) << msg;
  }
  {
    // Something that accepts connections but never speaks: the constructor's PING times out.
    ScriptedServer mute(dir.path(), {});
    const auto t0 = std::chrono::steady_clock::now();
    const std::string msg = error_of([&] { RedisStore store(mute.url(), 300); });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
    EXPECT_NE(msg.find("PING"), std::string::npos) << msg;
    EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
    EXPECT_NE(msg.find(mute.url()), std::string::npos) << msg;
  }
}

TEST(RedisStoreUrl, MalformedUrlsThrowNamingTheUrl) {
  for (const std::string url : {"redis:/x", "http://a:1", "redis://host:notaport", "redis://host",
                                "redis://:6379", "redis://host:0", "redis://host:65536",
                                "redis://host:6379/0", "unix://relative/sock", ""}) {
    const std::string msg = error_of([&] { RedisStore store(url, 200); });
    EXPECT_NE(msg.find("'" + url + "'"), std::string::npos) << url << " -> " << msg;
    // The same check without connecting, for configs checked before anything runs.
    const std::string parsed = error_of([&] { parse_redis_url(url); });
    EXPECT_EQ(parsed, msg) << url;
  }
  const RedisUrl tcp = parse_redis_url("redis://[::1]:6380");
  EXPECT_FALSE(tcp.is_unix);
  EXPECT_EQ(tcp.host, "::1");
  EXPECT_EQ(tcp.port, 6380);
  const RedisUrl unix_url = parse_redis_url("unix:///run/redis.sock");
  EXPECT_TRUE(unix_url.is_unix);
  EXPECT_EQ(unix_url.host, "/run/redis.sock");
}

// A reply longer than the value the caller expects is refused from its length line, naming the
// key, before anything is allocated for it (8 GiB announced here; none of it is sent), and by
// default above the largest value put() accepts.
TEST(RedisStoreFaults, AReplyLongerThanExpectedIsRefusedBeforeItsBytes) {
  ScratchDir dir;  // fake servers: runs without redis-server
  {
    ScriptedServer fake(dir.path(), {"+PONG\r\n", "$8589934592\r\n"});
    RedisStore store(fake.url(), 300);
    std::vector<uint8_t> got;
    const std::string msg = error_of([&] { store.get("big-key", &got, 4096); });
    EXPECT_NE(msg.find("'big-key'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("8589934592 bytes, more than the 4096 expected"), std::string::npos) << msg;
    EXPECT_EQ(got.capacity(), 0u);
  }
  {
    ScriptedServer fake(dir.path(), {"+PONG\r\n", "$1073741824\r\n"});
    RedisStore store(fake.url(), 300);
    std::vector<uint8_t> got;
    const std::string msg = error_of([&] { store.get("default-key", &got); });
    EXPECT_NE(msg.find("more than the " + std::to_string(kRedisMaxValueBytes) + " expected"),
              std::string::npos)
        << msg;
  }
}

TEST(RedisStoreUrl, MissingSocketThrowsWithThePath) {
  const std::string path = "/tmp/kvb_no_such_dir_for_redis_test/redis.sock";
  const std::string msg = error_of([&] { RedisStore store("unix://" + path, 200); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot connect"), std::string::npos) << msg;
}

TEST(RedisStoreUrl, RefusedTcpPortThrowsWithTheUrl) {
  // Port 1 (tcpmux) is not served on loopback; the connect is refused at once.
  const std::string msg = error_of([&] { RedisStore store("redis://127.0.0.1:1", 500); });
  EXPECT_NE(msg.find("redis://127.0.0.1:1"), std::string::npos) << msg;
}

TEST(LocalRedisServer, MaxmemoryOverflowSurfacesRedisOomError) {
  SKIP_WITHOUT_REDIS();
  LocalRedisServer server(int64_t{4} << 20);
  RedisStore store(server.url());
  const std::vector<uint8_t> value = random_bytes(size_t{1} << 20, 7);
  std::string msg;
  int stored = 0;
  for (; stored < 16 && msg.empty(); ++stored) {
    msg = [&]() -> std::string {
      try {
        store.put("blk" + std::to_string(stored), value.data(), value.size());
      } catch (const Error& e) {
        return e.what();
      }
      return "";
    }();
  }
  ASSERT_FALSE(msg.empty()) << "16 MiB went into a 4 MiB server without an error";
  EXPECT_NE(msg.find("OOM"), std::string::npos) << msg;
  EXPECT_NE(msg.find(server.url()), std::string::npos) << msg;
  EXPECT_NE(msg.find("blk" + std::to_string(stored - 1)), std::string::npos) << msg;
  // noeviction: what was stored before the error is all still there.
  std::vector<uint8_t> got;
  for (int i = 0; i + 1 < stored; ++i) {
    ASSERT_TRUE(store.get("blk" + std::to_string(i), &got)) << i;
    EXPECT_TRUE(got == value) << i;
  }
}

TEST(LocalRedisServer, DestructorStopsTheServerAndRemovesItsDirectory) {
  SKIP_WITHOUT_REDIS();
  auto server = std::make_unique<LocalRedisServer>();
  const pid_t pid = server->pid();
  const std::string dir = server->dir();
  const std::string url = server->url();
  ASSERT_GT(pid, 0);
  EXPECT_EQ(url.rfind("unix://", 0), 0u) << url;
  EXPECT_EQ(url.find(dir), 7u) << url;
  EXPECT_EQ(::kill(pid, 0), 0);
  EXPECT_TRUE(path_exists(dir));

  RedisStore store(url), other(url);
  const uint8_t v[] = {1, 2, 3};
  store.put("k", v, sizeof(v));

  const auto t0 = std::chrono::steady_clock::now();
  server.reset();
  // SIGTERM stops an idle redis-server in milliseconds; anything near the SIGKILL fallback's 5 s
  // means the polite stop did not work.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  errno = 0;
  EXPECT_EQ(::kill(pid, 0), -1) << "redis-server " << pid << " is still running";
  EXPECT_EQ(errno, ESRCH);
  EXPECT_FALSE(path_exists(dir)) << dir;

  // A store whose server went away fails with an error naming the URL; writing to the dead socket
  // must not kill this process with SIGPIPE, neither through hiredis (DEL) nor through the
  // direct path for values (SET).
  const std::string del_msg = error_of([&] { other.remove("k"); });
  EXPECT_NE(del_msg.find(url), std::string::npos) << del_msg;
  std::vector<uint8_t> big(size_t{4} << 20, 9);
  const std::string put_msg = error_of([&] { store.put("k2", big.data(), big.size()); });
  EXPECT_NE(put_msg.find(url), std::string::npos) << put_msg;
  // The next call tries to reconnect, and says why it cannot.
  const std::string get_msg = error_of([&] {
    std::vector<uint8_t> got;
    store.get("k", &got);
  });
  EXPECT_NE(get_msg.find("cannot connect"), std::string::npos) << get_msg;
  EXPECT_NE(get_msg.find(url), std::string::npos) << get_msg;
}

TEST(LocalRedisServer, TwoServersAreIndependent) {
  SKIP_WITHOUT_REDIS();
  LocalRedisServer a, b;
  EXPECT_NE(a.url(), b.url());
  RedisStore sa(a.url()), sb(b.url());
  const uint8_t v[] = {5};
  sa.put("shared-name", v, 1);
  std::vector<uint8_t> got;
  EXPECT_FALSE(sb.get("shared-name", &got));
  EXPECT_TRUE(sa.get("shared-name", &got));
}

}  // namespace
}  // namespace kvb
#endif  // KVB_NO_HIREDIS
