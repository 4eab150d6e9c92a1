/* agoq-topo: what topology/ sees and decides, for people (text) and scripts (JSON). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agoq_topo.h"
#include "agoq_topo_xml_check.h"

/* Reads the whole file (at most AGOQ_TOPO_XML_MAX_BYTES) plus a terminating NUL. */
static int agoq_topo_cli_read(const char* path, char** out, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return AGOQ_TOPO_ENOENT;
  size_t cap = 1u << 16, n = 0;
  char* buf = malloc(cap + 1);
  int rc = AGOQ_TOPO_OK;
  while (buf != NULL) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n < cap) break;
    if (cap > AGOQ_TOPO_XML_MAX_BYTES) break; /* the check refuses it with a reason */
    char* bigger = realloc(buf, 2 * cap + 1);
    if (bigger == NULL) free(buf);
    buf = bigger;
    cap *= 2;
  }
  if (buf == NULL) rc = AGOQ_TOPO_ENOMEM;
  else if (ferror(f)) rc = AGOQ_TOPO_ENOENT;
  fclose(f);
  if (rc != AGOQ_TOPO_OK) {
    free(buf);
    return rc;
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return AGOQ_TOPO_OK;
}

static bool agoq_topo_cli_write_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= (size_t)w;
  }
  return true;
}

static size_t agoq_topo_cli_read_all(int fd, void* p, size_t n) {
  char* c = p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, c + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

/* --xml: the strict check first (agoq_topo_xml_check.h), then hwloc in a forked child, so
 * that even a crash inside hwloc's XML reader is a "malformed topology XML" error and exit 1
 * rather than a core dump. Returns an AGOQ_TOPO_* code; prints its own message. */
static int agoq_topo_cli_load_xml(const char* path, agoq_topo* t) {
  char* buf = NULL;
  size_t len = 0;
  int rc = agoq_topo_cli_read(path, &buf, &len);
  if (rc != AGOQ_TOPO_OK) {
    fprintf(stderr, "agoq-topo: %s: %s\n", path, agoq_topo_strerror(rc));
    return rc;
  }
  char why[512]; /* room for the hwloc 1.x conversion hint */
  if (agoq_topo_xml_check(buf, len + 1, why, sizeof why) != 0) {
    fprintf(stderr, "agoq-topo: %s: %s: malformed topology XML: %s\n", path,
            agoq_topo_strerror(AGOQ_TOPO_EINVAL), why);
    free(buf);
    return AGOQ_TOPO_EINVAL;
  }
  int fds[2];
  if (pipe(fds) != 0) {
    fprintf(stderr, "agoq-topo: pipe: %s\n", strerror(errno));
    free(buf);
    return AGOQ_TOPO_ENOMEM;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "agoq-topo: fork: %s\n", strerror(errno));
    close(fds[0]);
    close(fds[1]);
    free(buf);
    return AGOQ_TOPO_ENOMEM;
  }
  if (pid == 0) {
    close(fds[0]);
    int crc = agoq_topo_load_xml_buffer(buf, (int)len + 1, t);
    bool ok = agoq_topo_cli_write_all(fds[1], &crc, sizeof crc) &&
              (crc != AGOQ_TOPO_OK || agoq_topo_cli_write_all(fds[1], t, sizeof *t));
    _exit(ok ? 0 : 3);
  }
  close(fds[1]);
  free(buf);
  int crc = AGOQ_TOPO_EINVAL;
  size_t got = agoq_topo_cli_read_all(fds[0], &crc, sizeof crc);
  if (got == sizeof crc && crc == AGOQ_TOPO_OK) got += agoq_topo_cli_read_all(fds[0], t, sizeof *t);
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    fprintf(stderr, "agoq-topo: %s: %s: malformed topology XML (hwloc crashed reading it: signal %d)\n", path,
            agoq_topo_strerror(AGOQ_TOPO_EINVAL), WTERMSIG(status));
    return AGOQ_TOPO_EINVAL;
  }
  if (got < sizeof crc || (crc == AGOQ_TOPO_OK && got != sizeof crc + sizeof *t) || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    fprintf(stderr, "agoq-topo: %s: %s: malformed topology XML (the hwloc reader failed)\n", path,
            agoq_topo_strerror(AGOQ_TOPO_EINVAL));
    return AGOQ_TOPO_EINVAL;
  }
  if (crc == AGOQ_TOPO_ENOHWLOC) {
    char hw[256];
    agoq_topo_hwloc_available(hw, sizeof hw);
    fprintf(stderr, "agoq-topo: --xml needs hwloc: %s\n", hw);
  } else if (crc != AGOQ_TOPO_OK) {
    fprintf(stderr, "agoq-topo: %s: %s\n", path, agoq_topo_strerror(crc));
  }
  return crc;
}

static void agoq_topo_usage(FILE* out) {
  fputs("usage: agoq-topo [--xml FILE | --sysfs [DIR]] [--nvml LIB] [--json]\n"
        "       (an option's value may follow it or an '=': --xml FILE, --xml=FILE)\n"
        "\n"
        "Prints the GPUs, NICs and NUMA nodes of this machine (hwloc when it can be loaded,\n"
        "else sysfs), the GPU x NIC path matrix in NCCL's terms (NVL, PIX, PXB, PXN, PHB, SYS),\n"
        "and the NIC and CPUs chosen for each GPU. With NVML, each GPU's NVLinks and the\n"
        "GPU x GPU / GPU x NIC matrix in nvidia-smi topo -m terms (X, NV#, PIX, PXB, PHB, NODE, SYS).\n"
        "\n"
        "  --xml FILE     read an hwloc XML topology instead of this machine (an error if\n"
        "                 the file is missing, fails agoq's strict XML check, or hwloc\n"
        "                 rejects it or crashes on it; never this machine)\n"
        "  --sysfs [DIR]  skip hwloc and read sysfs below DIR (default /sys; an error if DIR\n"
        "                 has neither class/net nor bus/pci)\n"
        "  --nvml LIB     NVLink facts from the NVML library LIB (default for this machine:\n"
        "                 libnvidia-ml.so.1; with --xml or --sysfs NVML is asked only with\n"
        "                 this option, so that output for a file does not depend on the host)\n"
        "  --json         print JSON instead of text\n"
        "  -h, --help     this text\n",
        out);
}

int main(int argc, char** argv) {
  enum { OPT_XML = 256, OPT_JSON, OPT_SYSFS, OPT_NVML };
  static const struct option options[] = {
      {"xml", required_argument, NULL, OPT_XML},
      {"json", no_argument, NULL, OPT_JSON},
      {"sysfs", optional_argument, NULL, OPT_SYSFS},
      {"nvml", required_argument, NULL, OPT_NVML},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char* xml = NULL;
  const char* sysfs = NULL;
  const char* nvml = NULL;
  bool json = false;
  int opt;
  while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    switch (opt) {
      case OPT_XML: xml = optarg; break;
      case OPT_JSON: json = true; break;
      case OPT_NVML:
        if (optarg[0] == '\0') {
          fputs("agoq-topo: --nvml: empty library name\n", stderr);
          return 2;
        }
        nvml = optarg;
        break;
      case OPT_SYSFS:
        /* getopt's optional argument takes only --sysfs=DIR; the documented --sysfs DIR
         * takes the next word when it is not an option. */
        if (optarg == NULL && optind < argc && argv[optind][0] != '-') optarg = argv[optind++];
        sysfs = optarg != NULL ? optarg : "/sys";
        if (sysfs[0] == '\0') {
          fputs("agoq-topo: --sysfs: empty directory name\n", stderr);
          return 2;
        }
        break;
      case 'h': agoq_topo_usage(stdout); return 0;
      default: agoq_topo_usage(stderr); return 2;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "agoq-topo: unexpected argument '%s'\n", argv[optind]);
    agoq_topo_usage(stderr);
    return 2;
  }
  if (xml != NULL && sysfs != NULL) {
    fputs("agoq-topo: --xml and --sysfs exclude each other\n", stderr);
    agoq_topo_usage(stderr);
    return 2;
  }

  agoq_topo* t = calloc(1, sizeof *t);
  if (t == NULL) {
    fputs("agoq-topo: out of memory\n", stderr);
    return 1;
  }
  int rc;
  if (xml != NULL) {
    rc = agoq_topo_cli_load_xml(xml, t);
  } else if (sysfs != NULL) {
    rc = agoq_topo_discover_sysfs(sysfs, t);
    if (rc != AGOQ_TOPO_OK) fprintf(stderr, "agoq-topo: sysfs %s: %s\n", sysfs, agoq_topo_strerror(rc));
  } else {
    bool fallback = false;
    rc = agoq_topo_discover(t, &fallback);
    if (fallback) {
      char why[256];
      agoq_topo_hwloc_available(why, sizeof why);
      fprintf(stderr, "agoq-topo: hwloc unavailable (%s); using sysfs\n", why);
    }
    if (rc != AGOQ_TOPO_OK) fprintf(stderr, "agoq-topo: %s\n", agoq_topo_strerror(rc));
    /* This machine: CUDA ordinals from the driver, if there is one. */
    if (rc == AGOQ_TOPO_OK) agoq_topo_cuda_annotate(t);
  }
  if (rc != AGOQ_TOPO_OK) {
    free(t);
    return 1;
  }
  /* NVLink: this machine's NVML when discovering this machine; for a file (--xml, --sysfs)
   * only the library named by --nvml (a fake one in the golden tests), since this host's
   * NVML knows nothing of the file's GPUs. */
  if (nvml != NULL || (xml == NULL && sysfs == NULL)) {
    agoq_topo_nvml_annotate(t, nvml);
    /* GPU-NIC NVLinks (a NIC at the far end of a GPU's link) through the path hook. */
    if (t->nvml_state == AGOQ_TOPO_NVML_LOADED) agoq_topo_set_nvl_hook(agoq_topo_nvml_nvl_hook, t);
  }
  agoq_topo_choice choice;
  agoq_topo_choose(t, &choice);
  if (json) agoq_topo_print_json(stdout, t, &choice);
  else agoq_topo_print_text(stdout, t, &choice);
  agoq_topo_set_nvl_hook(NULL, NULL);
  free(t);
  return ferror(stdout) ? 1 : 0;
}
