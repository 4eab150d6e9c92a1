/* agoq-fault SCENARIO [--seeds N] [--seed S] [--rogue N] [--path pieces|inline]: one fault
 * scenario (fault.h). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agoq_args.h"
#include "fault.h"

static void usage(FILE* out) {
  fputs("usage: agoq-fault kill_p2p|kill_coll|stall|flood|bitflip|bitflip_coll [--seeds N] [--seed S] [--rogue N]\n"
        "                  [--path pieces|inline]\n"
        "  --path  the TCP data path of the payloads (not for flood, which sends none): pieces\n"
        "          (default) sets AGOQ_SOCKET_INLINE=0, every payload on the data sockets; inline\n"
        "          sets AGOQ_SOCKET_INLINE=1G, every payload on the control socket\n",
        out);
}

int main(int argc, char** argv) {
  static const struct option opts[] = {{"seeds", required_argument, NULL, 'n'},
                                       {"seed", required_argument, NULL, 's'},
                                       {"rogue", required_argument, NULL, 'r'},
                                       {"path", required_argument, NULL, 'p'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int seeds = 6, nrogue = 1000;
  uint64_t seed = 0;
  fault_path path = FAULT_PATH_PIECES;
  bool path_given = false;
  int o;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
      /* Strict: "--seeds abc" used to run nothing and say PASSED. */
      case 'n': seeds = agoq_args_int_or_exit("agoq-fault", "--seeds", optarg, 1, 1000000); break;
      case 's': seed = agoq_args_ull_or_exit("agoq-fault", "--seed", optarg, UINT64_MAX); break;
      case 'r': nrogue = agoq_args_int_or_exit("agoq-fault", "--rogue", optarg, 1, 1000000); break;
      case 'p':
        if (strcmp(optarg, "pieces") == 0) path = FAULT_PATH_PIECES;
        else if (strcmp(optarg, "inline") == 0) path = FAULT_PATH_INLINE;
        else {
          fprintf(stderr, "agoq-fault: --path: expected pieces or inline, got \"%s\"\n", optarg);
          return 2;
        }
        path_given = true;
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind + 1 != argc) {
    usage(stderr);
    return 2;
  }
  /* A seed from the clock unless given: every run tries new points; the seed is printed so
   * a failure can be replayed with --seed. */
  if (seed == 0) seed = (uint64_t)fault_now_ms() ^ ((uint64_t)getpid() << 32);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* sc = argv[optind];
  /* flood sends no payload: a --path there would claim coverage the run does not have. */
  bool payload = strcmp(sc, "flood") != 0;
  if (!payload && path_given) {
    fprintf(stderr, "agoq-fault: --path does not apply to flood (no payload)\n");
    return 2;
  }
  /* CollNet connections have no data sockets (AGOQ_TP_LISTEN_INLINE): every slice goes
   * inline whatever AGOQ_SOCKET_INLINE says, so a pieces run would claim coverage of a path
   * that no longer exists. */
  bool coll = strcmp(sc, "kill_coll") == 0 || strcmp(sc, "bitflip_coll") == 0;
  if (coll && path_given && path == FAULT_PATH_PIECES) {
    fprintf(stderr, "agoq-fault: --path pieces does not apply to %s: CollNet connections carry every message inline "
            "on the control socket (no data sockets)\n", sc);
    return 2;
  }
  if (coll) path = FAULT_PATH_INLINE;
  /* Before any worker is forked: they all inherit it. Set even for the default, so an
   * AGOQ_SOCKET_INLINE in the caller's environment cannot move the payloads elsewhere. */
  if (payload) fault_path_set(path);
  const char* pname = payload ? fault_path_name(path) : "none";
  printf("fault: %s path=%s seed=%#llx\n", sc, pname, (unsigned long long)seed);
  int64_t t0 = fault_now_ms();
  int rc;
  if (strcmp(sc, "kill_p2p") == 0) rc = fault_sc_kill_p2p(seeds, seed, path);
  else if (strcmp(sc, "kill_coll") == 0) rc = fault_sc_kill_coll(seeds, seed, path);
  else if (strcmp(sc, "stall") == 0) rc = fault_sc_stall(path);
  else if (strcmp(sc, "flood") == 0) rc = fault_sc_flood(nrogue);
  else if (strcmp(sc, "bitflip") == 0) rc = fault_sc_bitflip(seeds, seed, path);
  else if (strcmp(sc, "bitflip_coll") == 0) rc = fault_sc_bitflip_coll(seeds, seed, path);
  else {
    usage(stderr);
    return 2;
  }
  printf("fault: %s path=%s %s in %lld ms\n", sc, pname,
         rc == 0 ? "PASSED" : rc == 77 ? "SKIPPED" : "FAILED", (long long)(fault_now_ms() - t0));
  return rc;
}
