/*
 * The wire column, measured: the bytes the plugin put on the wire for one size over the
 * bytes its messages would have been in the input type, as the plugin itself counted them
 * (AGOQ_STATS=1, docs/usage.md "Statistics"). Each rank gets its own AGOQ_STATS_FILE; after
 * a size's calls the ranks close their CollNet group, which makes the plugin write the
 * group's two lines (path=quantized, path=exact, event=close), read them, and connect a
 * fresh group for the next size. The ratio is sum(wire_bytes) / sum(wire_raw) over both
 * paths of every rank: 1.000 when every call went exact, whatever the configuration says.
 * The tool reads no AGOQ_* variable for its figures: the plugin's configuration (format,
 * block, min_bytes, chunk) is taken from the same lines.
 *
 * The user's own AGOQ_STATS / AGOQ_STATS_FILE still get what they asked for: the tool's
 * file replaces theirs for the plugin (only then are the lines in it this run's, and
 * theirs may be shared, stderr, or hold older runs), and every line the plugin writes
 * there is copied on as it is read: to their AGOQ_STATS_FILE, expanded as the plugin
 * expands it in the rank's process (agoq_stats_expand_path), or to stderr.
 *
 * The files are made before the ranks are forked, so rank 0 knows every one of them: on
 * SIGINT, SIGTERM, SIGHUP or SIGPIPE its handler stops the forked ranks (whose plugin could create
 * a file again) and removes them all; a forked rank that is signalled alone removes its
 * own (SIGPIPE too, as when the output goes to `head`). Every exit path removes them too
 * (perf_coll_stats_cleanup).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/agoq_params.h"
#include "core/agoq_stats.h"
#include "perf_coll.h"

#define PERF_WIRE_LINE_MAX 2048

/* Read by the signal handler: set up before the handlers are installed (paths) or before
 * any forked rank can load the plugin (children), and only async-signal-safe calls use
 * them there. */
static struct {
  char (*paths)[PERF_WIRE_PATH_MAX]; /* one per rank of this process group */
  int npaths;
  pid_t owner;                                  /* the process that made them */
  pid_t children[PERF_COLL_MAX_RANKS];          /* fork mode, rank 0: ranks 1.. */
  volatile sig_atomic_t nchildren;
  volatile sig_atomic_t mine;                   /* this process's file, -1 none */
  bool handlers;
  struct sigaction old[4];
  /* The user's request, read before the tool sets its own. */
  bool user_stats;
  char user_pattern[AGOQ_PARAM_STRING_MAX + 1]; /* "" = stderr */
  bool user_interval;                           /* AGOQ_STATS_INTERVAL_S was set */
} perf_stats = {.mine = -1};

/* SIGPIPE too: `agoq-perf ... | head` ends the run that way. */
static const int perf_stats_signals[4] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

static void perf_stats_on_signal(int sig) {
  int saved = errno;
  if (getpid() == perf_stats.owner) {
    /* Forked ranks first: a live one's plugin would create its file again. */
    for (int k = 0; k < perf_stats.nchildren; k++) kill(perf_stats.children[k], SIGKILL);
    for (int k = 0; k < perf_stats.nchildren; k++)
      while (waitpid(perf_stats.children[k], NULL, 0) < 0 && errno == EINTR) {
      }
    for (int k = 0; k < perf_stats.npaths; k++) unlink(perf_stats.paths[k]);
  } else if (perf_stats.mine >= 0) {
    unlink(perf_stats.paths[perf_stats.mine]);
  }
  errno = saved;
  /* SA_RESETHAND restored the default action; the signal is blocked until we return,
   * then it ends the process as it would have without us (the exit status says so). */
  raise(sig);
}

/* The user's AGOQ_STATS as the plugin would read it; -1 (printed) when the plugin would
 * refuse it. */
static int perf_stats_user_setting(void) {
  const char* v = getenv("AGOQ_STATS");
  perf_stats.user_stats = false;
  if (v != NULL && *v != '\0') {
    int64_t on = 0;
    char err[256];
    if (agoq_param_parse(agoq_param_describe(AGOQ_PARAM_STATS), v, &on, err, sizeof err) != ncclSuccess) {
      fprintf(stderr, "agoq-perf: %s\n", err);
      return -1;
    }
    perf_stats.user_stats = on != 0;
  }
  const char* f = getenv("AGOQ_STATS_FILE");
  snprintf(perf_stats.user_pattern, sizeof perf_stats.user_pattern, "%s", f != NULL ? f : "");
  const char* iv = getenv("AGOQ_STATS_INTERVAL_S");
  perf_stats.user_interval = iv != NULL && *iv != '\0';
  return 0;
}

int perf_coll_stats_prepare(int nfiles) {
  if (perf_stats_user_setting() != 0) return -1;
  const char* tmp = getenv("TMPDIR");
  if (tmp == NULL || *tmp == '\0' || strchr(tmp, '%') != NULL) tmp = "/tmp";
  perf_stats.paths = calloc((size_t)nfiles, sizeof(*perf_stats.paths));
  if (perf_stats.paths == NULL) {
    fprintf(stderr, "agoq-perf: out of memory for %d statistics file names\n", nfiles);
    return -1;
  }
  perf_stats.owner = getpid();
  perf_stats.nchildren = 0;
  perf_stats.mine = -1;
  for (int k = 0; k < nfiles; k++) {
    snprintf(perf_stats.paths[k], PERF_WIRE_PATH_MAX, "%s/agoq-perf-stats-%d-XXXXXX", tmp, (int)getpid());
    int fd = mkstemp(perf_stats.paths[k]);
    if (fd < 0) {
      fprintf(stderr, "agoq-perf: cannot create a statistics file in %s: %s\n", tmp, strerror(errno));
      perf_stats.paths[k][0] = '\0';
      perf_coll_stats_cleanup();
      return -1;
    }
    close(fd);
    perf_stats.npaths = k + 1; /* the handler removes only files that exist */
    if (k == 0) {
      /* Installed once the first file exists: from here on an interrupt removes them. A
       * signal the caller ignores (nohup's SIGHUP, a background job's SIGINT) stays
       * ignored. */
      struct sigaction sa;
      memset(&sa, 0, sizeof sa);
      sa.sa_handler = perf_stats_on_signal;
      sa.sa_flags = SA_RESETHAND;
      sigemptyset(&sa.sa_mask);
      for (int i = 0; i < 4; i++) {
        sigaction(perf_stats_signals[i], NULL, &perf_stats.old[i]);
        if (perf_stats.old[i].sa_handler != SIG_IGN) sigaction(perf_stats_signals[i], &sa, NULL);
      }
      perf_stats.handlers = true;
    }
  }
  return 0;
}

void perf_coll_stats_children(const perf_group* g) {
  if (g->rank != 0 || g->links == NULL) return;
  int n = 0;
  for (int k = 1; k < g->nranks && n < PERF_COLL_MAX_RANKS; k++)
    if (g->links[k].child_pid > 0) perf_stats.children[n++] = g->links[k].child_pid;
  perf_stats.nchildren = n;
}

void perf_coll_stats_cleanup(void) {
  if (perf_stats.handlers) {
    for (int i = 0; i < 4; i++)
      if (perf_stats.old[i].sa_handler != SIG_IGN) sigaction(perf_stats_signals[i], &perf_stats.old[i], NULL);
    perf_stats.handlers = false;
  }
  if (perf_stats.paths == NULL) return;
  /* Rank 0 of a fork run removes every rank's file (its ranks are gone by now: their
   * group was closed); any other process only its own. */
  if (getpid() == perf_stats.owner) {
    for (int k = 0; k < perf_stats.npaths; k++)
      if (perf_stats.paths[k][0] != '\0') unlink(perf_stats.paths[k]);
  } else if (perf_stats.mine >= 0) {
    unlink(perf_stats.paths[perf_stats.mine]);
  }
  perf_stats.nchildren = 0;
  perf_stats.mine = -1;
  perf_stats.npaths = 0;
  free(perf_stats.paths);
  perf_stats.paths = NULL;
}

int perf_coll_wire_begin(perf_coll_wire* w, int rank) {
  memset(w, 0, sizeof(*w));
  w->user_fd = -1;
  int index = perf_stats.npaths == 1 ? 0 : rank;
  if (perf_stats.paths == NULL || index < 0 || index >= perf_stats.npaths) {
    fprintf(stderr, "agoq-perf: rank %d: no statistics file was prepared for it\n", rank);
    return -1;
  }
  snprintf(w->path, sizeof w->path, "%s", perf_stats.paths[index]);
  perf_stats.mine = index;
  w->forward = perf_stats.user_stats;
  if (w->forward && perf_stats.user_pattern[0] != '\0') {
    /* As the plugin names its file in this process (agoq_stats.c): the host name with
     * blanks made '_', this rank's pid. */
    char host[256], err[128];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    for (char* c = host; *c; c++)
      if (*c == ' ' || *c == '\t') *c = '_';
    if (!agoq_stats_expand_path(perf_stats.user_pattern, host, (int)getpid(), w->user_path, sizeof w->user_path,
                                err, sizeof err)) {
      fprintf(stderr, "agoq-perf: rank %d: AGOQ_STATS_FILE=\"%s\": %s; statistics go to stderr\n", rank,
              perf_stats.user_pattern, err);
      w->user_path[0] = '\0';
    }
  }
  /* Before the plugin is loaded: it reads its parameters at init. */
  setenv("AGOQ_STATS", "1", 1);
  setenv("AGOQ_STATS_FILE", w->path, 1);
  /* Interval lines would only be skipped by the reader; a user who asked for them gets
   * them copied on. */
  if (!(perf_stats.user_stats && perf_stats.user_interval)) unsetenv("AGOQ_STATS_INTERVAL_S");
  return 0;
}

/* Copies bytes the plugin wrote to where the user asked for them (opened at the first
 * bytes, as the plugin opens its output at its first entry). */
static void perf_wire_forward(perf_coll_wire* w, const char* buf, size_t len) {
  if (!w->forward || len == 0) return;
  if (w->user_fd < 0) {
    w->user_fd = STDERR_FILENO;
    if (w->user_path[0] != '\0') {
      int fd = open(w->user_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0)
        fprintf(stderr, "agoq-perf: AGOQ_STATS_FILE: cannot open %s: %s; statistics go to stderr\n",
                w->user_path, strerror(errno));
      else
        w->user_fd = fd;
    }
  }
  while (len > 0) {
    ssize_t n = write(w->user_fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fprintf(stderr, "agoq-perf: cannot copy the plugin's statistics to %s: %s\n",
              w->user_fd == STDERR_FILENO ? "stderr" : w->user_path, strerror(errno));
      w->forward = false;
      return;
    }
    buf += n;
    len -= (size_t)n;
  }
}

void perf_coll_wire_end(perf_coll_wire* w) {
  if (w->path[0] != '\0') {
    /* Lines written since the last size's read (exit or interval lines) go on too. */
    FILE* f = w->forward ? fopen(w->path, "r") : NULL;
    if (f != NULL && fseek(f, w->offset, SEEK_SET) == 0) {
      char buf[PERF_WIRE_LINE_MAX];
      size_t n;
      while ((n = fread(buf, 1, sizeof buf, f)) > 0) perf_wire_forward(w, buf, n);
    }
    if (f != NULL) fclose(f);
    unlink(w->path);
  }
  if (w->user_fd > STDERR_FILENO) close(w->user_fd);
  w->user_fd = -1;
  w->path[0] = '\0';
}

/* The value of `key=` in line as text (up to the next blank), or NULL. */
static const char* perf_wire_field(const char* line, const char* key, char* out, size_t outlen) {
  char pat[48];
  snprintf(pat, sizeof pat, " %s=", key);
  const char* p = strstr(line, pat);
  if (p == NULL) return NULL;
  p += strlen(pat);
  size_t n = strcspn(p, " \n");
  if (n == 0 || n >= outlen) return NULL;
  memcpy(out, p, n);
  out[n] = '\0';
  return out;
}

/* A "%.3f" milliseconds field, as integer nanoseconds (so ranks can sum them exactly). */
static int perf_wire_ms_ns(const char* line, const char* key, uint64_t* ns) {
  char text[32];
  if (perf_wire_field(line, key, text, sizeof text) == NULL) return -1;
  char* end;
  errno = 0;
  double ms = strtod(text, &end);
  if (errno != 0 || *end != '\0' || !(ms >= 0)) return -1;
  *ns = (uint64_t)(ms * 1e6 + 0.5);
  return 0;
}

static int perf_wire_u64(const char* line, const char* key, uint64_t* v) {
  char text[32];
  if (perf_wire_field(line, key, text, sizeof text) == NULL) return -1;
  char* end;
  errno = 0;
  unsigned long long x = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0') return -1;
  *v = (uint64_t)x;
  return 0;
}

/* The close lines of this rank's group written since the last read: wire and raw bytes of
 * both paths, and the plugin's configuration. */
static int perf_wire_read(perf_coll_wire* w, int rank, uint64_t* wire, uint64_t* raw, uint64_t* codec_ns,
                          uint64_t* crc_ns) {
  FILE* f = fopen(w->path, "r");
  if (f == NULL || fseek(f, w->offset, SEEK_SET) != 0) {
    fprintf(stderr, "agoq-perf: rank %d: cannot read the plugin's statistics %s: %s\n", rank, w->path,
            strerror(errno));
    if (f != NULL) fclose(f);
    return -1;
  }
  char line[PERF_WIRE_LINE_MAX];
  int paths = 0;
  *wire = *raw = *codec_ns = *crc_ns = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    perf_wire_forward(w, line, strlen(line)); /* every line, as the plugin wrote it */
    if (strncmp(line, "agoq-stats ", 11) != 0 || strstr(line, " kind=collnet ") == NULL ||
        strstr(line, " event=close ") == NULL)
      continue;
    uint64_t wb, wr, cn, rn;
    if (perf_wire_u64(line, "wire_bytes", &wb) != 0 || perf_wire_u64(line, "wire_raw", &wr) != 0 ||
        perf_wire_ms_ns(line, "codec_ms", &cn) != 0 || perf_wire_ms_ns(line, "crc_ms", &rn) != 0)
      continue;
    *wire += wb;
    *raw += wr;
    *codec_ns += cn;
    *crc_ns += rn;
    paths++;
    perf_wire_field(line, "format", w->format, sizeof w->format);
    uint64_t x;
    if (perf_wire_u64(line, "block", &x) == 0) w->block = (unsigned)x;
    if (perf_wire_u64(line, "min_bytes", &x) == 0) w->min_bytes = x;
    if (perf_wire_u64(line, "chunk", &x) == 0) w->pipeline_chunk = x;
  }
  w->offset = ftell(f);
  fclose(f);
  if (paths != 2) {
    fprintf(stderr, "agoq-perf: rank %d: the plugin wrote %d CollNet statistics lines at closeColl, expected 2 "
            "(quantized, exact) in %s\n", rank, paths, w->path);
    return -1;
  }
  return 0;
}

int perf_coll_wire_cycle(perf_coll_net* c, perf_group* g, perf_coll_wire* w, int timeout_ms,
                         perf_coll_wire_figures* out) {
  /* Nobody closes under a peer's last bytes. */
  if (perf_group_barrier(g, timeout_ms) != 0) return -1;
  int ok = 1;
  ncclResult_t r = perf_coll_close_group(c);
  if (r != ncclSuccess) {
    fprintf(stderr, "agoq-perf: rank %d: CollNet closeColl failed: %s\n", g->rank, agoq_result_str(r));
    ok = 0;
  }
  uint64_t mine[4] = {0, 0, 0, 0};
  if (ok && perf_wire_read(w, g->rank, &mine[0], &mine[1], &mine[2], &mine[3]) != 0) ok = 0;
  uint64_t all[PERF_COLL_MAX_RANKS][5];
  uint64_t share[5] = {mine[0], mine[1], mine[2], mine[3], (uint64_t)ok};
  if (perf_group_allgather(g, share, all, sizeof(share), timeout_ms) != 0) return -1;
  uint64_t wire = 0, raw = 0, codec_ns = 0, crc_ns = 0;
  for (int k = 0; k < g->nranks; k++) {
    if (!all[k][4]) return -1; /* that rank said why */
    wire += all[k][0];
    raw += all[k][1];
    codec_ns += all[k][2];
    crc_ns += all[k][3];
  }
  out->ratio = raw > 0 ? (double)wire / (double)raw : 1.0;
  out->codec_ms = (double)codec_ns / 1e6;
  out->crc_ms = (double)crc_ns / 1e6;
  if (perf_coll_connect(c, g) != 0) return -1;
  return perf_coll_register(c, w->send, w->send_bytes, w->recv, w->recv_bytes);
}
