/*
 * agoq-collnet-harness: conformance of the built plugin's CollNet tables, N processes on
 * this host driving them as NCCL's proxy drives them on N node heads.
 *
 *   agoq-collnet-harness --scenario NAME [--nranks N] [--abi V] [--lib PATH]
 *                        [--timeout-s S] [--device] [--list]
 *
 * A scenario marked "all versions" runs once per exported CollNet version (or only --abi);
 * the others run on --abi, default the newest. One PASS/FAIL line per run; exit 1 if
 * anything failed, 2 on a usage error. --device puts every buffer the plugin gets in
 * (emulated) device memory, registered NCCL_PTR_CUDA (collnet_device.c): for the test
 * plugin built over the CUDA emulation, in builds that have it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agoq_args.h"
#include "collnet_harness.h"

static const cn_scenario* cn_find(const char* name) {
  for (size_t i = 0; i < cn_scenario_count; i++)
    if (strcmp(cn_scenarios[i].name, name) == 0) return &cn_scenarios[i];
  return NULL;
}

/* The whole string, in range (tools/common/agoq_args.h). */
static int cn_parse_long(const char* s, long min, long max, long* out) {
  long long v = 0;
  if (agoq_args_parse_ll(s, min, max, &v) != 0) return -1;
  *out = (long)v;
  return 0;
}

/* ---- worker ---- */

int cn_worker_main(int argc, char** argv) {
  cn_worker w;
  memset(&w, 0, sizeof(w));
  w.ctrl_fd = -1;
  const char* scenario = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* o = argv[i];
    const char* v = argv[i + 1];
    long n = 0;
    unsigned long long u = 0;
    int bad = 0;
    if (strcmp(o, "--worker") == 0) bad = cn_parse_long(v, 0, CN_MAX_RANKS - 1, &n), w.rank = (int)n;
    else if (strcmp(o, "--nranks") == 0) bad = cn_parse_long(v, 1, CN_MAX_RANKS, &n), w.nranks = (int)n;
    else if (strcmp(o, "--version") == 0) bad = cn_parse_long(v, 6, 12, &n), w.version = (int)n;
    else if (strcmp(o, "--ctrl-fd") == 0) bad = cn_parse_long(v, 0, 1 << 20, &n), w.ctrl_fd = (int)n;
    else if (strcmp(o, "--scenario") == 0) scenario = v;
    else if (strcmp(o, "--lib") == 0) w.lib_path = v;
    else if (strcmp(o, "--comm-id") == 0) bad = agoq_args_parse_ull(v, UINT64_MAX, &u), w.comm_id = u;
    if (bad) {
      fprintf(stderr, "collnet worker: bad value for %s: '%s'\n", o, v);
      return 2;
    }
  }
  w.sc = scenario ? cn_find(scenario) : NULL;
  if (w.sc == NULL || w.ctrl_fd < 0 || w.nranks == 0 || w.lib_path == NULL) {
    fprintf(stderr, "collnet worker: bad arguments\n");
    return 2;
  }
  w.sc->run(&w);
  cn_close(&w);
  cn_send_result(&w, w.failed ? CN_RESULT_FAIL : CN_RESULT_PASS, w.event_ns, w.why);
  close(w.ctrl_fd);
  return w.failed ? 1 : 0;
}

/* ---- orchestrator ---- */

static void cn_usage(FILE* f) {
  fprintf(f,
          "usage: agoq-collnet-harness --scenario NAME [--nranks N] [--abi V] [--lib PATH]\n"
          "                            [--timeout-s S] [--device] [--list]\n"
          "Drives the plugin's ncclCollNetPlugin_vN tables with N processes over loopback as\n"
          "NCCL's proxy does. Default library: $AGOQ_PLUGIN_PATH, else\n"
          "<exe dir>/../lib/libnccl-net-agoq.so.\n"
          "  --device   every buffer in device memory of the CUDA emulation, registered\n"
          "             NCCL_PTR_CUDA; for libnccl-net-agoq-emu.so (staging: AGOQ_GPU_STAGING)\n");
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && strcmp(argv[1], "--worker") == 0) return cn_worker_main(argc, argv);
  const char* lib = NULL;
  const char* scenario = NULL;
  long nranks = 4, abi = 0, timeout_s = 300;
  for (int i = 1; i < argc; i++) {
    const char* o = argv[i];
    if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) {
      cn_usage(stdout);
      return 0;
    }
    if (strcmp(o, "--device") == 0) {
      if (!cn_device_available()) {
        fprintf(stderr, "agoq-collnet-harness: --device needs the CUDA emulation, which this "
                        "build lacks\n");
        return 2;
      }
      setenv("AGOQ_COLLNET_DEVICE", "1", 1); /* the workers inherit it (collnet_device.c) */
      setenv("AGOQ_GPU", "on", 0);           /* device buffers need the path a user turns on */
      continue;
    }
    if (strcmp(o, "--list") == 0) {
      for (size_t s = 0; s < cn_scenario_count; s++)
        printf("%-10s %s%s\n", cn_scenarios[s].name, cn_scenarios[s].summary,
               cn_scenarios[s].flags & CN_SC_ALL_VERSIONS ? " (every version)" : "");
      return 0;
    }
    const char* v = i + 1 < argc ? argv[++i] : NULL;
    int bad = v == NULL;
    if (bad) {
    } else if (strcmp(o, "--lib") == 0) {
      lib = v;
    } else if (strcmp(o, "--scenario") == 0) {
      scenario = v;
    } else if (strcmp(o, "--nranks") == 0) {
      bad = cn_parse_long(v, 1, CN_MAX_RANKS, &nranks);
    } else if (strcmp(o, "--abi") == 0) {
      bad = cn_parse_long(v, AGOQ_LOADER_MIN_VERSION, AGOQ_LOADER_MAX_VERSION, &abi);
    } else if (strcmp(o, "--timeout-s") == 0) {
      bad = cn_parse_long(v, 1, 86400, &timeout_s);
    } else {
      bad = 1;
    }
    if (bad) {
      fprintf(stderr, "agoq-collnet-harness: bad option %s %s\n", o, v ? v : "");
      cn_usage(stderr);
      return 2;
    }
  }
  const cn_scenario* sc = scenario ? cn_find(scenario) : NULL;
  if (sc == NULL) {
    fprintf(stderr, "agoq-collnet-harness: %s scenario (--list names them)\n",
            scenario ? "unknown" : "no");
    return 2;
  }
  if (lib == NULL) lib = agoq_netlib_default_path();
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    fprintf(stderr, "agoq-collnet-harness: cannot find its own executable\n");
    return 2;
  }
  self[n] = '\0';
  /* The version list only: dlopen starts no plugin thread until init. */
  agoq_netlib* l = NULL;
  char err[512] = "";
  if (agoq_netlib_open(lib, &l, err, sizeof(err)) != 0) {
    printf("FAIL collnet.%s: cannot load %s: %s\n", sc->name, lib, err);
    return 1;
  }
  int versions[AGOQ_LOADER_NUM_VERSIONS];
  int nv = agoq_netlib_collnet_versions(l, versions, AGOQ_LOADER_NUM_VERSIONS);
  agoq_netlib_close(l);
  if (nv <= 0) {
    printf("FAIL collnet.%s: %s exports no ncclCollNetPlugin_vN\n", sc->name, lib);
    return 1;
  }
  int run[AGOQ_LOADER_NUM_VERSIONS], nrun = 0;
  if (abi > 0) {
    bool found = false;
    for (int i = 0; i < nv; i++) found = found || versions[i] == abi;
    if (!found) {
      printf("FAIL collnet.%s: ncclCollNetPlugin_v%ld is not exported\n", sc->name, abi);
      return 1;
    }
    run[nrun++] = (int)abi;
  } else if (sc->flags & CN_SC_ALL_VERSIONS) {
    for (int i = 0; i < nv; i++) run[nrun++] = versions[i];
  } else {
    run[nrun++] = versions[0];
  }
  int failures = 0;
  const char* mode = cn_device_mode() ? " (device)" : "";
  for (int i = 0; i < nrun; i++) {
    char why[8192];
    int64_t t0 = cn_now_ns();
    int rc = cn_run_scenario(self, lib, sc, (int)nranks, run[i], (int)timeout_s, why, sizeof why);
    double s = (double)(cn_now_ns() - t0) / 1e9;
    if (rc == 0) {
      printf("PASS collnet.%s%s v%d, %ld ranks (%.1f s)\n", sc->name, mode, run[i], nranks, s);
    } else {
      printf("FAIL collnet.%s%s v%d, %ld ranks (%.1f s): %s\n", sc->name, mode, run[i], nranks, s,
             why);
      failures++;
    }
  }
  return failures ? 1 : 0;
}
