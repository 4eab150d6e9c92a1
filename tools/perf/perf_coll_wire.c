/*
 * The wire column, measured: the bytes the plugin put on the wire for one size over the
 * bytes its messages would have been in the input type, as the plugin itself counted them
 * (AGOQ_STATS=1, docs/usage.md "Statistics"). Each rank gets its own AGOQ_STATS_FILE; after
 * a size's calls the ranks close their CollNet group, which makes the plugin write the
 * group's two lines (path=quantized, path=exact, event=close), read them, and connect a
 * fresh group for the next size. The ratio is sum(wire_bytes) / sum(wire_raw) over both
 * paths of every rank: 1.000 when every call went exact, whatever the configuration says.
 * The tool reads no AGOQ_* variable: the plugin's configuration (format, block,
 * min_bytes, chunk) is taken from the same lines.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf_coll.h"

#define PERF_WIRE_LINE_MAX 2048

int perf_coll_wire_begin(perf_coll_wire* w, int rank) {
  memset(w, 0, sizeof(*w));
  const char* tmp = getenv("TMPDIR");
  if (tmp == NULL || *tmp == '\0' || strchr(tmp, '%') != NULL) tmp = "/tmp";
  snprintf(w->path, sizeof w->path, "%s/agoq-perf-stats-%d-XXXXXX", tmp, (int)getpid());
  int fd = mkstemp(w->path);
  if (fd < 0) {
    fprintf(stderr, "agoq-perf: rank %d: cannot create a statistics file in %s: %s\n", rank, tmp,
            strerror(errno));
    return -1;
  }
  close(fd);
  /* Before the plugin is loaded: it reads its parameters at init. The tool's own file
   * replaces any the user named: only then are the lines in it this run's. */
  setenv("AGOQ_STATS", "1", 1);
  setenv("AGOQ_STATS_FILE", w->path, 1);
  unsetenv("AGOQ_STATS_INTERVAL_S");
  return 0;
}

void perf_coll_wire_end(perf_coll_wire* w) {
  if (w->path[0] != '\0') unlink(w->path);
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
