/*
 * agoq-abi-harness: conformance of the built plugin's net tables, driven as NCCL's proxy
 * drives them, two processes per connection over loopback.
 *
 *   agoq-abi-harness [--lib PATH] [--version N]... [--scenario NAME]... [--list]
 *                    [--timeout-s SECONDS] [--device]
 *
 * Without --version every exported net version runs; without --scenario every scenario.
 * Prints one PASS/FAIL line per (version, scenario) and exits 1 if anything failed, 2 on a
 * usage error, 3 when the global watchdog fired.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agoq_args.h"
#include "abi_harness.h"

#define ABI_MAX_VERSIONS 32
#define ABI_MAX_SELECT 32

static const abi_scenario* abi_find_scenario(const char* name) {
  for (size_t i = 0; i < abi_scenario_count; i++)
    if (strcmp(abi_scenarios[i].name, name) == 0) return &abi_scenarios[i];
  return NULL;
}

static void abi_watchdog(int sig) {
  (void)sig;
  static const char msg[] = "abi: global watchdog expired: killing workers\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
  abi_kill_all_workers();
  _exit(3);
}

/* ---- worker side ---- */

typedef struct {
  int role, version, ctrl_fd, result_fd;
  bool newest;
  uint64_t comm_id;
  const char* scenario;
  const char* lib;
} abi_worker_args;

static int abi_worker_main(const abi_worker_args* a) {
  abi_worker w;
  memset(&w, 0, sizeof(w));
  w.role = a->role;
  w.ctrl_fd = a->ctrl_fd;
  w.result_fd = a->result_fd;
  w.comm_id = a->comm_id;
  w.newest = a->newest;
  w.view.version = a->version;
  w.sc = abi_find_scenario(a->scenario);
  if (w.sc == NULL || a->role < 0 || a->role > 1 ||
      (a->role == 1 && (w.sc->flags & ABI_SC_SINGLE))) {
    abi_fail(&w, __FILE__, __LINE__, "bad worker arguments (scenario %s role %d)", a->scenario,
             a->role);
  } else if (abi_worker_setup(&w, a->lib, a->version) == 0) {
    w.sc->run(&w);
  }
  abi_worker_teardown(&w);
  if (w.failed) {
    size_t len = strlen(w.why);
    ssize_t ignored = write(w.result_fd, w.why, len);
    (void)ignored;
  }
  return w.failed ? 1 : 0;
}

/* ---- orchestrator side ---- */

static void abi_usage(FILE* f) {
  fprintf(f,
          "usage: agoq-abi-harness [--lib PATH] [--version N]... [--scenario NAME]...\n"
          "                        [--timeout-s SECONDS] [--list] [--device]\n"
          "Drives every exported ncclNetPlugin_vN of the plugin as NCCL's proxy does, across\n"
          "two processes over loopback. Default library: $AGOQ_PLUGIN_PATH, else\n"
          "<exe dir>/../lib/libnccl-net-agoq.so.\n");
}

/* The whole string, in range (tools/common/agoq_args.h). */
static int abi_parse_int(const char* s, long min, long max, long* out) {
  long long v = 0;
  if (agoq_args_parse_ll(s, min, max, &v) != 0) return -1;
  *out = (long)v;
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* lib = NULL;
  const char* scenarios[ABI_MAX_SELECT];
  int nscenarios = 0;
  int versions_sel[ABI_MAX_SELECT];
  int nversions_sel = 0;
  long global_timeout = 600;
  bool list = false;
  abi_worker_args wa = {.role = -1, .version = -1, .ctrl_fd = -1, .result_fd = -1};
  bool worker = false;

  for (int i = 1; i < argc; i++) {
    const char* opt = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : NULL;
    long v = 0;
    unsigned long long u = 0;
    if (strcmp(opt, "--list") == 0) {
      list = true;
    } else if (strcmp(opt, "--newest") == 0) {
      wa.newest = true;
    } else if (strcmp(opt, "--device") == 0) {
#ifdef ABI_HAVE_DEVICE
      /* The workers inherit it (abi_device.c). */
      setenv("AGOQ_ABI_DEVICE", "1", 1);
      /* Device buffers need the GPU data path, which a user turns on (auto keeps it off). */
      setenv("AGOQ_GPU", "on", 0);
#else
      fprintf(stderr, "agoq-abi-harness: --device needs the CUDA emulation, which this build lacks\n");
      return 2;
#endif
    } else if (strcmp(opt, "-h") == 0 || strcmp(opt, "--help") == 0) {
      abi_usage(stdout);
      return 0;
    } else if (val == NULL) {
      fprintf(stderr, "agoq-abi-harness: %s needs a value\n", opt);
      return 2;
    } else if (strcmp(opt, "--lib") == 0) {
      lib = val;
      wa.lib = val;
      i++;
    } else if (strcmp(opt, "--scenario") == 0) {
      if (abi_find_scenario(val) == NULL) {
        fprintf(stderr, "agoq-abi-harness: unknown scenario '%s' (see --list)\n", val);
        return 2;
      }
      if (nscenarios < ABI_MAX_SELECT) scenarios[nscenarios++] = val;
      wa.scenario = val;
      i++;
    } else if (strcmp(opt, "--version") == 0 && abi_parse_int(val, 1, 99, &v) == 0) {
      if (nversions_sel < ABI_MAX_SELECT) versions_sel[nversions_sel++] = (int)v;
      wa.version = (int)v;
      i++;
    } else if (strcmp(opt, "--timeout-s") == 0 && abi_parse_int(val, 1, 86400, &v) == 0) {
      global_timeout = v;
      i++;
    } else if (strcmp(opt, "--worker") == 0 && abi_parse_int(val, 0, 1, &v) == 0) {
      worker = true;
      wa.role = (int)v;
      i++;
    } else if (strcmp(opt, "--ctrl-fd") == 0 && abi_parse_int(val, 0, INT_MAX, &v) == 0) {
      wa.ctrl_fd = (int)v;
      i++;
    } else if (strcmp(opt, "--result-fd") == 0 && abi_parse_int(val, 0, INT_MAX, &v) == 0) {
      wa.result_fd = (int)v;
      i++;
    } else if (strcmp(opt, "--comm-id") == 0 && agoq_args_parse_ull(val, UINT64_MAX, &u) == 0) {
      wa.comm_id = u;
      i++;
    } else {
      fprintf(stderr, "agoq-abi-harness: bad option or value: %s %s\n", opt, val);
      abi_usage(stderr);
      return 2;
    }
  }

  if (worker) {
    if (wa.lib == NULL || wa.scenario == NULL || wa.version < 0 || wa.ctrl_fd < 0 ||
        wa.result_fd < 0) {
      fprintf(stderr, "agoq-abi-harness: incomplete worker arguments\n");
      return 2;
    }
    return abi_worker_main(&wa);
  }

  if (list) {
    for (size_t i = 0; i < abi_scenario_count; i++)
      printf("%-16s %3d s  %s\n", abi_scenarios[i].name, abi_scenarios[i].timeout_s,
             abi_scenarios[i].summary);
    return 0;
  }

  /* Two processes on one host: loopback unless the caller chose interfaces. */
  if (getenv("AGOQ_SOCKET_IFNAME") == NULL && getenv("NCCL_SOCKET_IFNAME") == NULL)
    setenv("AGOQ_SOCKET_IFNAME", "lo", 1);

  char self_exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
  if (n <= 0) {
    fprintf(stderr, "agoq-abi-harness: readlink /proc/self/exe: %s\n", strerror(errno));
    return 2;
  }
  self_exe[n] = '\0';
  if (lib == NULL) lib = agoq_netlib_default_path();
  if (lib == NULL) {
    fprintf(stderr, "agoq-abi-harness: no plugin path (use --lib or AGOQ_PLUGIN_PATH)\n");
    return 2;
  }

  /* Only dlopen here, no init: the orchestrator must stay free of plugin threads. */
  agoq_netlib* nl = NULL;
  char err[512] = "";
  if (agoq_netlib_open(lib, &nl, err, sizeof(err)) != 0) {
    fprintf(stderr, "agoq-abi-harness: cannot open %s: %s\n", lib, err);
    return 1;
  }
  int versions[ABI_MAX_VERSIONS];
  int nversions = agoq_netlib_net_versions(nl, versions, ABI_MAX_VERSIONS);
  agoq_netlib_close(nl);
  if (nversions <= 0) {
    fprintf(stderr, "agoq-abi-harness: %s exports no ncclNetPlugin_vN table\n", lib);
    return 1;
  }

  signal(SIGALRM, abi_watchdog);
  alarm((unsigned)global_timeout);

  printf("# agoq-abi-harness: %s\n# net versions:", lib);
  for (int i = 0; i < nversions; i++) printf(" v%d", versions[i]);
  printf("\n");

  int passed = 0, failed = 0, ran_versions = 0;
  for (int vi = 0; vi < nversions; vi++) {
    int version = versions[vi];
    bool selected = nversions_sel == 0;
    for (int k = 0; k < nversions_sel; k++) selected |= versions_sel[k] == version;
    if (!selected) continue;
    ran_versions++;
    for (size_t si = 0; si < abi_scenario_count; si++) {
      const abi_scenario* sc = &abi_scenarios[si];
      bool chosen = nscenarios == 0;
      for (int k = 0; k < nscenarios; k++) chosen |= strcmp(scenarios[k], sc->name) == 0;
      if (!chosen) continue;
      int64_t t0 = abi_now_ms();
      abi_outcome out;
      abi_run_scenario(self_exe, lib, version, vi == 0, sc, &out);
      double secs = (double)(abi_now_ms() - t0) / 1000.0;
      if (out.passed) {
        passed++;
        printf("[v%-2d] %-16s PASS (%.2f s)\n", version, sc->name, secs);
      } else {
        failed++;
        printf("[v%-2d] %-16s FAIL (%.2f s) %s\n", version, sc->name, secs, out.reason);
      }
    }
  }
  if (ran_versions == 0) {
    fprintf(stderr, "agoq-abi-harness: none of the requested versions is exported\n");
    return 1;
  }
  printf("# %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
