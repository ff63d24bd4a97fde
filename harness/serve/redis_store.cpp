#include "harness/serve/redis_store.h"

#include <sys/un.h>

#include <algorithm>
#include <string>

#include "harness/common/error.h"

namespace kvb {

namespace {
constexpr size_t kSocketPathMax = sizeof(sockaddr_un{}.sun_path) - 1;  // room for the NUL

bool url_port_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}
}  // namespace

RedisUrl parse_redis_url(const std::string& url) {
  constexpr const char* kExpected = "expected redis://HOST:PORT or unix:///path/to/socket";
  const std::string kRedis = "redis://", kUnix = "unix://";
  RedisUrl u;
  if (url.compare(0, kUnix.size(), kUnix) == 0) {
    u.is_unix = true;
    u.host = url.substr(kUnix.size());
    KVB_CHECK(!u.host.empty() && u.host[0] == '/', "malformed Redis URL '", url,
              "': the socket path must be absolute (", kExpected, ")");
    KVB_CHECK(u.host.size() <= kSocketPathMax, "Redis URL '", url, "': socket path is ",
              u.host.size(), " bytes, longer than the ", kSocketPathMax,
              " a unix socket address holds");
    return u;
  }
  KVB_CHECK(url.compare(0, kRedis.size(), kRedis) == 0, "malformed Redis URL '", url, "' (",
            kExpected, ")");
  const std::string rest = url.substr(kRedis.size());
  KVB_CHECK(rest.find('@') == std::string::npos, "Redis URL '", url,
            "': credentials in the URL are not supported (", kExpected, ")");
  KVB_CHECK(rest.find('/') == std::string::npos, "malformed Redis URL '", url,
            "': no path or database number allowed after HOST:PORT (", kExpected, ")");
  std::string port;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:PORT
    const size_t close = rest.find(']');
    KVB_CHECK(close != std::string::npos && close + 1 < rest.size() && rest[close + 1] == ':',
              "malformed Redis URL '", url, "' (", kExpected, ")");
    u.host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    KVB_CHECK(colon != std::string::npos, "malformed Redis URL '", url, "': no port (", kExpected,
              ")");
    u.host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    KVB_CHECK(u.host.find(':') == std::string::npos, "malformed Redis URL '", url,
              "': write an IPv6 host in brackets, e.g. redis://[::1]:6379");
  }
  KVB_CHECK(!u.host.empty(), "malformed Redis URL '", url, "': empty host (", kExpected, ")");
  KVB_CHECK(
      url_port_digits(port) && port.size() <= 5 && std::stoi(port) >= 1 && std::stoi(port) <= 65535,
      "malformed Redis URL '", url, "': port '", port, "' is not a number in 1..65535");
  u.port = std::stoi(port);
  return u;
}

}  // namespace kvb

#ifndef KVB_NO_HIREDIS

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "harness/common/error.h"

extern char** environ;

namespace kvb {
namespace {

constexpr int kServerStartTimeoutMs = 5000;
constexpr int kServerStopTimeoutMs = 5000;
constexpr size_t kSunPathMax = sizeof(sockaddr_un{}.sun_path) - 1;  // room for the NUL

// A key as it appears in messages: quoted, non-printable bytes escaped (keys may be binary hashes),
// and cut short so a huge key cannot drown the message.
std::string describe_key(const std::string& key) {
  constexpr size_t kMaxShown = 120;
  std::string out = "'";
  for (size_t i = 0; i < key.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  out += "'";
  if (key.size() > kMaxShown) out += detail::concat("... (", key.size(), " bytes)");
  return out;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// hiredis writes with plain write(), so a server that closed the connection would kill the whole
// process with SIGPIPE. Ignoring SIGPIPE process-wide would change how `kvbench | head` behaves, so
// instead block it on this thread for the duration of one command and swallow one raised by it.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

timeval to_timeval(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>(ms % 1000) * 1000;
  return tv;
}

std::string reply_text(const redisReply* r) {
  return r->str != nullptr ? std::string(r->str, r->len) : std::string();
}

std::string find_on_path(const std::string& name) {
  const char* env = std::getenv("PATH");
  const std::string path = env != nullptr && *env != '\0' ? env : "/usr/local/bin:/usr/bin:/bin";
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

std::string make_temp_dir(const std::string& parent) {
  std::string pattern = parent + "/kvb_redis_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    KVB_FAIL("cannot create a temp directory for redis-server under ", parent, ": ",
             std::strerror(errno));
  }
  return pattern;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RedisStore

void RedisStore::ReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

RedisStore::RedisStore(const std::string& url, int timeout_ms)
    : url_(url), timeout_ms_(timeout_ms) {
  KVB_CHECK(timeout_ms > 0, "Redis URL ", url, ": timeout_ms must be positive, got ", timeout_ms);
  const RedisUrl u = parse_redis_url(url);
  is_unix_ = u.is_unix;
  host_ = u.host;
  port_ = u.port;
  connect();
}

RedisStore::~RedisStore() { disconnect(); }

void RedisStore::disconnect() noexcept {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

void RedisStore::connect() {
  disconnect();
  const timeval tv = to_timeval(timeout_ms_);
  redisContext* c = is_unix_ ? redisConnectUnixWithTimeout(host_.c_str(), tv)
                             : redisConnectWithTimeout(host_.c_str(), port_, tv);
  KVB_CHECK(c != nullptr, "cannot connect to Redis at ", url_, ": out of memory");
  if (c->err != 0) {
    const std::string why = c->errstr;
    redisFree(c);
    KVB_FAIL("cannot connect to Redis at ", url_, ": ", why,
             is_unix_ ? " (is a redis-server listening on that socket?)" : "", " [timeout ",
             timeout_ms_, " ms]");
  }
  ctx_ = c;
  if (redisSetTimeout(ctx_, tv) != REDIS_OK) {
    const std::string why = ctx_->errstr;
    disconnect();
    KVB_FAIL("cannot set the I/O timeout on the connection to Redis at ", url_, ": ", why);
  }
  // The fd must not leak into children such as a LocalRedisServer spawned later: a server holding
  // a copy of our connection would keep it open after we close it.
  const int flags = ::fcntl(ctx_->fd, F_GETFD);
  if (flags >= 0) ::fcntl(ctx_->fd, F_SETFD, flags | FD_CLOEXEC);
  // PING so that a URL naming something that is not (an accessible) Redis fails here, naming the
  // URL, rather than at the first put. The constructor's caller gets no destructor run if this
  // throws, hence the explicit disconnect.
  try {
    const char* argv[] = {"PING"};
    const size_t len[] = {4};
    Reply r = command("PING", 1, argv, len);
    KVB_CHECK(r->type == REDIS_REPLY_STATUS && reply_text(r.get()) == "PONG", "Redis at ", url_,
              " did not answer PING with PONG (reply type ", r->type, ")");
  } catch (...) {
    disconnect();
    throw;
  }
}

RedisStore::Reply RedisStore::command(const std::string& what, int argc, const char** argv,
                                      const size_t* argv_len) {
  if (ctx_ == nullptr) connect();
  redisReply* raw = nullptr;
  {
    SigpipeGuard guard;
    raw = static_cast<redisReply*>(redisCommandArgv(ctx_, argc, argv, argv_len));
  }
  return checked(what, raw);
}

RedisStore::Reply RedisStore::checked(const std::string& what, redisReply* raw) {
  if (raw == nullptr) {
    // The context is unusable after an I/O or protocol error (a late reply could still arrive and
    // be taken for the next command's), so drop it; the next call reconnects.
    std::string why = ctx_ != nullptr && ctx_->err != 0 ? ctx_->errstr : "no reply";
    // hiredis reports a socket timeout as the bare EAGAIN text, which reads like a server fault.
    if (why == std::strerror(EAGAIN)) why = "timed out (" + why + ")";
    fail_io(what, why);
  }
  Reply reply(raw);
  if (reply->type == REDIS_REPLY_ERROR) {
    KVB_FAIL("Redis at ", url_, " refused ", what, ": ", reply_text(reply.get()));
  }
  return reply;
}

void RedisStore::fail_io(const std::string& what, const std::string& why) {
  disconnect();
  KVB_FAIL("Redis at ", url_, ": ", what, " failed: ", why, " (I/O timeout ", timeout_ms_,
           " ms; the connection was dropped and will be reopened by the next call)");
}

void RedisStore::send_all(const std::string& what, iovec* iov, int iov_count) {
  while (iov_count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iov_count);
    // MSG_NOSIGNAL: a server that closed the connection gives EPIPE here, not a process-killing
    // SIGPIPE.
    const ssize_t sent = ::sendmsg(ctx_->fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      fail_io(what, errno == EAGAIN || errno == EWOULDBLOCK ? "timed out while sending"
                                                            : std::strerror(errno));
    }
    size_t left = static_cast<size_t>(sent);
    while (iov_count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iov_count;
    }
    if (iov_count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
}

size_t RedisStore::recv_some(const std::string& what, void* buf, size_t bytes) {
  for (;;) {
    // MSG_WAITALL: one call per value where the socket allows, instead of one per socket buffer.
    const ssize_t got = ::recv(ctx_->fd, buf, bytes, MSG_WAITALL);
    if (got > 0) return static_cast<size_t>(got);
    if (got == 0) fail_io(what, "the server closed the connection");
    if (errno == EINTR) continue;
    fail_io(what, errno == EAGAIN || errno == EWOULDBLOCK ? "timed out waiting for the reply"
                                                          : std::strerror(errno));
  }
}

void RedisStore::put(const std::string& key, const void* data, size_t bytes) {
  KVB_CHECK(bytes <= kRedisMaxValueBytes, "Redis at ", url_, ": value for key ", describe_key(key),
            " is ", bytes, " bytes, above the ", kRedisMaxValueBytes,
            " bytes (512 MiB) Redis accepts in one value (proto-max-bulk-len); split the block");
  KVB_CHECK(data != nullptr || bytes == 0, "Redis at ", url_, ": put of key ", describe_key(key),
            " got a null data pointer for ", bytes, " bytes");
  const std::string what = detail::concat("SET key ", describe_key(key), " (", bytes, " bytes)");
  if (ctx_ == nullptr) connect();
  // The RESP array hiredis would format for SET %b %b, sent from the caller's memory.
  std::string head = detail::concat("*3\r\n$3\r\nSET\r\n$", key.size(), "\r\n");
  const std::string mid = detail::concat("\r\n$", bytes, "\r\n");
  char crlf[] = "\r\n";
  iovec iov[5] = {{head.data(), head.size()},
                  {const_cast<char*>(key.data()), key.size()},
                  {const_cast<char*>(mid.data()), mid.size()},
                  {const_cast<void*>(data), bytes},
                  {crlf, 2}};
  send_all(what, iov, 5);
  // hiredis' output buffer is empty, so this only reads (and parses) the short status reply.
  void* raw = nullptr;
  if (redisGetReply(ctx_, &raw) != REDIS_OK) raw = nullptr;
  Reply r = checked(what, static_cast<redisReply*>(raw));
  KVB_CHECK(r->type == REDIS_REPLY_STATUS && reply_text(r.get()) == "OK", "Redis at ", url_, ": ",
            what, " answered '", reply_text(r.get()), "' instead of OK (reply type ", r->type, ")");
}

bool RedisStore::get(const std::string& key, std::vector<uint8_t>* out, size_t max_bytes) {
  KVB_CHECK(out != nullptr, "Redis at ", url_, ": get of key ", describe_key(key),
            " needs an output vector");
  const std::string what = detail::concat("GET key ", describe_key(key));
  if (ctx_ == nullptr) connect();
  std::string head = detail::concat("*2\r\n$3\r\nGET\r\n$", key.size(), "\r\n");
  char crlf[] = "\r\n";
  iovec iov[3] = {
      {head.data(), head.size()}, {const_cast<char*>(key.data()), key.size()}, {crlf, 2}};
  send_all(what, iov, 3);

  // The reply is "$<len>\r\n<len bytes>\r\n", "$-1\r\n" (missing) or "-<error>\r\n". It is the only
  // thing in flight on this connection, so nothing past it can be read by accident. The first
  // read is small (a miss or a small value fits); the payload then goes straight into *out.
  char buf[4096];
  size_t have = 0, eol = 0;
  for (;;) {
    const char* nl = have >= 2 ? static_cast<const char*>(::memmem(buf, have, "\r\n", 2)) : nullptr;
    if (nl != nullptr) {
      eol = static_cast<size_t>(nl - buf);
      break;
    }
    if (have == sizeof(buf)) fail_io(what, "reply line longer than 4096 bytes");
    // Without MSG_WAITALL here: the header is short and a miss is all there is.
    const ssize_t got = ::recv(ctx_->fd, buf + have, sizeof(buf) - have, 0);
    if (got == 0) fail_io(what, "the server closed the connection");
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_io(what, errno == EAGAIN || errno == EWOULDBLOCK ? "timed out waiting for the reply"
                                                            : std::strerror(errno));
    }
    have += static_cast<size_t>(got);
  }
  const std::string line(buf + 1, eol - (eol > 0 ? 1 : 0));
  if (buf[0] == '-') {
    // An error reply is complete once its line is; the connection stays usable.
    if (have != eol + 2) fail_io(what, "unexpected bytes after the error reply");
    KVB_FAIL("Redis at ", url_, " refused ", what, ": ", line);
  }
  if (buf[0] != '$') fail_io(what, "unexpected reply '" + line.substr(0, 80) + "' (not a string)");
  if (line == "-1") {
    out->clear();
    return false;
  }
  if (!all_digits(line) || line.size() > 12) fail_io(what, "malformed bulk length '" + line + "'");
  const size_t len = static_cast<size_t>(std::stoll(line));
  if (len > max_bytes) {
    // The value is left unread on the socket: the connection is dropped, like after an I/O error.
    disconnect();
    KVB_FAIL("Redis at ", url_, ": ", what, " answered a value of ", len, " bytes, more than the ",
             max_bytes, " expected for it (not what was put there; the connection was dropped)");
  }
  out->resize(len);
  // Payload and trailing CRLF: what the first read already holds, then the rest straight in.
  const size_t in_buf = have - (eol + 2);
  const size_t payload_in_buf = std::min(in_buf, len);
  if (payload_in_buf > 0) std::memcpy(out->data(), buf + eol + 2, payload_in_buf);
  for (size_t done = payload_in_buf; done < len;) {
    done += recv_some(what, out->data() + done, len - done);
  }
  char tail[2];
  size_t tail_have = in_buf - payload_in_buf;
  if (tail_have > 2) fail_io(what, "unexpected bytes after the value");
  std::memcpy(tail, buf + eol + 2 + payload_in_buf, tail_have);
  while (tail_have < 2) tail_have += recv_some(what, tail + tail_have, 2 - tail_have);
  if (tail[0] != '\r' || tail[1] != '\n') fail_io(what, "value not followed by CRLF");
  return true;
}

bool RedisStore::remove(const std::string& key) {
  const char* argv[] = {"DEL", key.data()};
  const size_t len[] = {3, key.size()};
  Reply r = command(detail::concat("DEL key ", describe_key(key)), 2, argv, len);
  KVB_CHECK(r->type == REDIS_REPLY_INTEGER, "Redis at ", url_, ": DEL key ", describe_key(key),
            " answered reply type ", r->type, " instead of an integer");
  return r->integer > 0;
}

int64_t RedisStore::used_memory_bytes() {
  const char* argv[] = {"INFO", "memory"};
  const size_t len[] = {4, 6};
  Reply r = command("INFO memory", 2, argv, len);
  KVB_CHECK(r->type == REDIS_REPLY_STRING, "Redis at ", url_, ": INFO memory answered reply type ",
            r->type, " instead of a string");
  // Lines are "name:value\r\n"; match the whole name so used_memory_human & co. do not count.
  const std::string info = reply_text(r.get());
  const std::string field = "used_memory:";
  size_t at = 0;
  while ((at = info.find(field, at)) != std::string::npos) {
    if (at == 0 || info[at - 1] == '\n') {
      const size_t begin = at + field.size();
      const size_t end = info.find_first_of("\r\n", begin);
      const std::string value = info.substr(begin, end == std::string::npos ? end : end - begin);
      KVB_CHECK(all_digits(value) && value.size() < 19, "Redis at ", url_,
                ": INFO memory has a malformed used_memory value '", value, "'");
      return std::stoll(value);
    }
    at += field.size();
  }
  KVB_FAIL("Redis at ", url_, ": INFO memory has no used_memory field");
}

void RedisStore::flush() {
  const char* argv[] = {"FLUSHDB"};
  const size_t len[] = {7};
  Reply r = command("FLUSHDB", 1, argv, len);
  KVB_CHECK(r->type == REDIS_REPLY_STATUS, "Redis at ", url_, ": FLUSHDB answered reply type ",
            r->type, " instead of OK");
}

// ---------------------------------------------------------------------------------------------
// LocalRedisServer

bool LocalRedisServer::available() { return !find_on_path("redis-server").empty(); }

LocalRedisServer::LocalRedisServer(int64_t maxmemory_bytes) {
  KVB_CHECK(maxmemory_bytes >= 0,
            "LocalRedisServer: maxmemory_bytes must be >= 0 (0: no limit), got ", maxmemory_bytes);
  const std::string exe = find_on_path("redis-server");
  if (exe.empty()) {
    const char* path = std::getenv("PATH");
    KVB_FAIL("redis-server not found on PATH (", path != nullptr ? path : "",
             "); scripts/setup.sh installs it (Debian package redis-server)");
  }
  const char* tmp = std::getenv("TMPDIR");
  dir_ = make_temp_dir(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  // A unix socket address holds about 107 bytes; a deep $TMPDIR would not fit, /tmp does.
  if (dir_.size() + std::strlen("/redis.sock") > kSunPathMax) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_ = make_temp_dir("/tmp");
  }
  socket_path_ = dir_ + "/redis.sock";
  log_path_ = dir_ + "/redis.log";

  try {
    // clang-format off
    std::vector<std::string> args = {exe,
                                     "--port", "0",  // unix socket only: nothing else can reach it
                                     "--unixsocket", socket_path_,
                                     "--unixsocketperm", "700",
                                     "--dir", dir_,
                                     "--save", "",  // no RDB snapshots
                                     "--appendonly", "no",
                                     "--logfile", "",  // stdout, which is the log file
                                     "--daemonize", "no",
                                     "--maxmemory", std::to_string(maxmemory_bytes),
                                     // A tier that evicted blocks would turn a full server into
                                     // silent misses; an OOM error is visible.
                                     "--maxmemory-policy", "noeviction"};
    // clang-format on
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    // The spawning thread may block or ignore signals (worker threads often block all); the server
    // must get a clean slate or SIGTERM would not stop it.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGINT);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, exe.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    KVB_CHECK(rc == 0, "cannot start ", exe, ": ", std::strerror(rc),
              " (scripts/setup.sh installs redis-server)");
    pid_ = pid;

    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kServerStartTimeoutMs);
    std::string last_error = "socket not created yet";
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        const std::string how = WIFEXITED(status)
                                    ? detail::concat("exited with status ", WEXITSTATUS(status))
                                    : detail::concat("was killed by signal ", WTERMSIG(status));
        KVB_FAIL("redis-server (", exe, ") ", how, " before answering on ", socket_path_,
                 "; scripts/setup.sh installs redis-server. Log tail:\n", log_tail());
      }
      redisContext* c = redisConnectUnixWithTimeout(socket_path_.c_str(), to_timeval(500));
      if (c != nullptr && c->err == 0) {
        redisSetTimeout(c, to_timeval(500));
        redisReply* r = nullptr;
        {
          SigpipeGuard guard;
          r = static_cast<redisReply*>(redisCommand(c, "PING"));
        }
        const bool pong = r != nullptr && r->type == REDIS_REPLY_STATUS && reply_text(r) == "PONG";
        // Redis answers PING with -LOADING while it starts; keep waiting then.
        last_error = r != nullptr ? reply_text(r) : c->errstr;
        if (r != nullptr) freeReplyObject(r);
        redisFree(c);
        if (pong) break;
      } else {
        if (c != nullptr) last_error = c->errstr;
        if (c != nullptr) redisFree(c);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        KVB_FAIL("redis-server (", exe, ") did not answer PING on ", socket_path_, " within ",
                 kServerStartTimeoutMs, " ms (last error: ", last_error,
                 "); scripts/setup.sh installs redis-server. Log tail:\n", log_tail());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } catch (...) {
    stop();
    throw;
  }
}

LocalRedisServer::~LocalRedisServer() { stop(); }

void LocalRedisServer::stop() noexcept {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kServerStopTimeoutMs);
    bool reaped = false;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r == -1 && errno != EINTR)) {  // -1: reaped elsewhere (SIGCHLD ignored)
        reaped = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!reaped) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) == -1 && errno == EINTR) {
      }
    }
    pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string LocalRedisServer::log_tail() const {
  constexpr std::streamoff kTailBytes = 2000;
  std::ifstream in(log_path_, std::ios::binary | std::ios::ate);
  if (!in.good()) return "(no log at " + log_path_ + ")";
  const std::streamoff size = in.tellg();
  in.seekg(std::max<std::streamoff>(0, size - kTailBytes));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------------------------
// measure_redis_bandwidth

RedisBandwidth measure_redis_bandwidth(RedisStore& store, int64_t value_bytes, int repeats,
                                       uint64_t seed) {
  KVB_CHECK(value_bytes > 0 && static_cast<uint64_t>(value_bytes) <= kRedisMaxValueBytes,
            "measure_redis_bandwidth on ", store.url(), ": value_bytes must be in 1..",
            kRedisMaxValueBytes, ", got ", value_bytes);
  KVB_CHECK(repeats >= 1, "measure_redis_bandwidth on ", store.url(),
            ": repeats must be >= 1, got ", repeats);
  const size_t n = static_cast<size_t>(value_bytes);

  std::vector<uint8_t> base(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t w = rng();
    std::memcpy(base.data() + i, &w, std::min<size_t>(8, n - i));
  }
  base[0] |= 1;  // never all-zero: a store that returned zeroed memory must not pass the check
  // Each value differs from the others in its last 8 bytes (XOR with repeat+1), so a get that
  // returned another key's value fails the check too. Byte 0 is left alone to stay non-zero.
  auto stamp = [&](int r) {
    if (n <= 8) return;
    const uint64_t s = static_cast<uint64_t>(r) + 1;
    for (int b = 0; b < 8; ++b) base[n - 8 + b] ^= static_cast<uint8_t>(s >> (8 * b));
  };

  // Fresh keys, so that the measurement never overwrites or deletes anything else in the database.
  std::random_device rd;
  const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ seed;
  std::vector<std::string> keys;
  for (int r = 0; r < repeats; ++r) {
    keys.push_back(detail::concat("kvb:bw:", std::hex, nonce, std::dec, ":", r));
  }
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };

  RedisBandwidth out;
  out.value_bytes = value_bytes;
  out.repeats = repeats;
  std::vector<double> put_ms, get_ms;
  try {
    for (int r = 0; r < repeats; ++r) {
      stamp(r);
      const auto t0 = Clock::now();
      store.put(keys[r], base.data(), n);
      put_ms.push_back(ms_since(t0));
      stamp(r);  // XOR again: back to the base
    }
    std::vector<uint8_t> got;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = Clock::now();
      const bool found = store.get(keys[r], &got, static_cast<size_t>(value_bytes));
      get_ms.push_back(ms_since(t0));
      KVB_CHECK(found, "measure_redis_bandwidth on ", store.url(), ": key '", keys[r],
                "' vanished between put and get (evicted or flushed by someone else?)");
      stamp(r);
      const bool same = got.size() == n && std::memcmp(got.data(), base.data(), n) == 0;
      stamp(r);
      if (!same) {
        size_t first = 0;
        while (first < std::min(n, got.size()) && got[first] == base[first]) ++first;
        KVB_FAIL("measure_redis_bandwidth on ", store.url(), ": key '", keys[r], "' came back as ",
                 got.size(), " bytes differing from the ", n, " bytes put, first at byte ", first);
      }
    }
  } catch (...) {
    for (const std::string& k : keys) {
      try {
        store.remove(k);
      } catch (...) {  // the original error is the one worth reporting
      }
    }
    throw;
  }
  for (const std::string& k : keys) store.remove(k);

  double put_total_ms = 0, get_total_ms = 0;
  for (double v : put_ms) put_total_ms += v;
  for (double v : get_ms) get_total_ms += v;
  const double total_bytes = static_cast<double>(value_bytes) * repeats;
  // Clamp to a nanosecond so an absurdly fast clock tick still gives a finite number.
  out.put_gbps = total_bytes / (std::max(put_total_ms, 1e-6) * 1e-3) / 1e9;
  out.get_gbps = total_bytes / (std::max(get_total_ms, 1e-6) * 1e-3) / 1e9;
  out.put_ms_p50 = median(put_ms);
  out.get_ms_p50 = median(get_ms);
  return out;
}

}  // namespace kvb

#else  // KVB_NO_HIREDIS: built where libhiredis-dev is missing (e.g. the GPU image). Every entry point
       // says so instead of pretending to store anything.

#include "harness/common/error.h"

namespace kvb {

namespace {
[[noreturn]] void no_hiredis(const std::string& what) {
  KVB_FAIL(what, ": this kvbench was built without hiredis (install libhiredis-dev, e.g. with "
           "scripts/setup.sh, and rebuild)");
}
}  // namespace

void RedisStore::ReplyDeleter::operator()(redisReply*) const {}
RedisStore::RedisStore(const std::string& url, int timeout_ms) : url_(url), timeout_ms_(timeout_ms) {
  no_hiredis("Redis store " + url);
}
RedisStore::~RedisStore() = default;
void RedisStore::put(const std::string&, const void*, size_t) { no_hiredis("Redis store " + url_); }
bool RedisStore::get(const std::string&, std::vector<uint8_t>*, size_t) {
  no_hiredis("Redis store " + url_);
}
bool RedisStore::remove(const std::string&) { no_hiredis("Redis store " + url_); }
int64_t RedisStore::used_memory_bytes() { no_hiredis("Redis store " + url_); }
void RedisStore::flush() { no_hiredis("Redis store " + url_); }
LocalRedisServer::LocalRedisServer(int64_t) { no_hiredis("local redis-server"); }
LocalRedisServer::~LocalRedisServer() = default;
bool LocalRedisServer::available() { return false; }
RedisBandwidth measure_redis_bandwidth(RedisStore& store, int64_t, int, uint64_t) {
  no_hiredis("Redis store " + store.url());
}

}  // namespace kvb

#endif  // KVB_NO_HIREDIS
