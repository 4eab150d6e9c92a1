/*
 * agoq-plan: for a Megatron-style job, the bytes each parallel group puts on the inter-node
 * links per iteration, their time at the NIC's line rate, and what agoq would leave of them:
 * compressed only where agoq's tuner would choose it, by the tuner's own cost model
 * (plugin/tuner/agoq_tuner_cost.h) at the tuner's codec speed (agoq_tuner_codec_setting). A model
 * (plan_model.h), labelled as one in its output.
 *
 *   agoq-plan [--model llama2-7b|llama2-13b|llama2-70b] [--layers N --hidden N --heads N
 *             --kv-heads N --ffn N --swiglu --vocab N --tied] [--params-b B]
 *             --seq N --micro-batch N --global-batch N --tp N --pp N --dp N
 *             [--dist-opt] [--grad-dtype fp32|bf16] [--nvswitch yes|no] --gpus-per-node N
 *             --nic-gbps G [--format int8,int4,...] [--block N] [--codec-mbps M]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_args.h"
#include "agoq_codec.h"
#include "core/agoq_params.h"
#include "plan_model.h"
#include "tuner/agoq_tuner_cost.h"

static const char* prog = "agoq-plan";

static void usage(FILE* out) {
  fprintf(out,
          "usage: %s [--model llama2-7b|llama2-13b|llama2-70b] [--layers N --hidden N --heads N\n"
          "                 --kv-heads N --ffn N --swiglu --vocab N --tied] [--params-b B] --seq N\n"
          "                 --micro-batch N --global-batch N --tp N --pp N --dp N [--dist-opt]\n"
          "                 [--grad-dtype fp32|bf16] [--nvswitch yes|no] --gpus-per-node N --nic-gbps G\n"
          "                 [--format LIST] [--block N] [--codec-mbps M]\n"
          "The bytes each parallel group of a Megatron-style job sends over the busiest node's NIC per\n"
          "iteration, their time at line rate, and what agoq's formats (default int8) leave of them,\n"
          "compressed only where agoq's tuner would choose compression (its cost model, the codec at\n"
          "--codec-mbps, default AGOQ_CODEC_MBPS). A model, not a measurement.\n"
          "  --nic-gbps G     Gbit/s of the node's network link, PER NODE (shared by all its GPUs)\n"
          "  --kv-heads N     K/V heads of grouped-query attention (default: --heads)\n"
          "  --nvswitch       NVSwitch in the node (default no): NCCL's CollNet-Direct, the only\n"
          "                   CollNet algorithm for ReduceScatter (--dist-opt)\n"
          "  --codec-mbps M   MB/s of the codec (quantize + dequantize); default AGOQ_CODEC_MBPS\n"
          "TP must divide --gpus-per-node or be a multiple of it, and so must TP x DP.\n",
          prog);
}

/* The options that take one whole number, into an int or a long long of the job. */
typedef struct {
  const char* name;
  int* i;
  long long* ll;
  long long min, max;
} plan_int_opt;

static const plan_int_opt* plan_int_find(const plan_int_opt* t, size_t n, const char* name) {
  for (size_t k = 0; k < n; k++)
    if (!strcmp(t[k].name, name)) return &t[k];
  return NULL;
}

static void gb(char* out, size_t len, double bytes) { snprintf(out, len, "%.3f GB", bytes / 1e9); }

int main(int argc, char** argv) {
  agoq_plan_job j = {.grad_bytes = 4, .micro_batch = 1, .gpus_per_node = 8};
  const char* formats = "int8";
  uint32_t block = 128;
  bool have_model = false;
  double codec_mbps = 0.0; /* 0: AGOQ_CODEC_MBPS */
  const plan_int_opt ints[] = {
      {"--layers", &j.layers, NULL, 1, 100000},
      {"--hidden", &j.hidden, NULL, 1, 1 << 20},
      {"--heads", &j.heads, NULL, 1, 1 << 16},
      {"--kv-heads", &j.kv_heads, NULL, 1, 1 << 16},
      {"--ffn", &j.ffn_hidden, NULL, 1, 1 << 22},
      {"--vocab", &j.vocab, NULL, 1, 1 << 24},
      {"--seq", NULL, &j.seq, 1, 1LL << 30},
      {"--micro-batch", NULL, &j.micro_batch, 1, 1LL << 20},
      {"--global-batch", NULL, &j.global_batch, 1, 1LL << 30},
      {"--tp", &j.tp, NULL, 1, 1 << 16},
      {"--pp", &j.pp, NULL, 1, 1 << 16},
      {"--dp", &j.dp, NULL, 1, 1 << 20},
      {"--gpus-per-node", &j.gpus_per_node, NULL, 1, 1024},
  };
  for (int i = 1; i < argc; i++) {
    const char* o = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEXT()                                              \
  do {                                                      \
    if (v == NULL) {                                        \
      fprintf(stderr, "%s: %s needs a value\n", prog, o);   \
      return 2;                                             \
    }                                                       \
    i++;                                                    \
  } while (0)
    const plan_int_opt* io = plan_int_find(ints, sizeof ints / sizeof ints[0], o);
    if (io != NULL) {
      NEXT();
      long long x = agoq_args_ll_or_exit(prog, o, v, io->min, io->max);
      if (io->i != NULL) *io->i = (int)x;
      if (io->ll != NULL) *io->ll = x;
      if (io->i == &j.layers) have_model = true;
    } else if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(o, "--model")) {
      NEXT();
      if (!strcmp(v, "llama2-7b")) {
        j.layers = 32, j.hidden = 4096, j.heads = 32, j.ffn_hidden = 11008;
      } else if (!strcmp(v, "llama2-13b")) {
        j.layers = 40, j.hidden = 5120, j.heads = 40, j.ffn_hidden = 13824;
      } else if (!strcmp(v, "llama2-70b")) {
        j.layers = 80, j.hidden = 8192, j.heads = 64, j.kv_heads = 8, j.ffn_hidden = 28672; /* GQA: 8 K/V heads */
      } else {
        fprintf(stderr, "%s: unknown --model '%s' (llama2-7b, llama2-13b, llama2-70b; or give the shapes)\n", prog,
                v);
        return 2;
      }
      j.swiglu = true, j.vocab = 32000, have_model = true;
    } else if (!strcmp(o, "--swiglu")) {
      j.swiglu = true;
    } else if (!strcmp(o, "--tied")) {
      j.tied_embeddings = true;
    } else if (!strcmp(o, "--params-b")) {
      NEXT();
      double b = 0;
      if (agoq_args_parse_double(v, 0.001, 100000, &b) != 0) {
        fprintf(stderr, "%s: bad value for --params-b: '%s' (billions, 0.001 to 100000)\n", prog, v);
        return 2;
      }
      j.params_b = b;
    } else if (!strcmp(o, "--dist-opt")) {
      j.dist_opt = true;
    } else if (!strcmp(o, "--grad-dtype")) {
      NEXT();
      if (strcmp(v, "fp32") && strcmp(v, "bf16")) {
        fprintf(stderr, "%s: bad value for --grad-dtype: '%s' (fp32 or bf16)\n", prog, v);
        return 2;
      }
      j.grad_bytes = !strcmp(v, "fp32") ? 4 : 2;
    } else if (!strcmp(o, "--nic-gbps")) {
      NEXT();
      if (agoq_args_parse_double(v, 0.001, 1e6, &j.nic_gbps) != 0) {
        fprintf(stderr, "%s: bad value for --nic-gbps: '%s' (Gbit/s per node)\n", prog, v);
        return 2;
      }
    } else if (!strcmp(o, "--nvswitch")) {
      NEXT();
      if (strcmp(v, "yes") && strcmp(v, "no")) {
        fprintf(stderr, "%s: bad value for --nvswitch: '%s' (yes or no)\n", prog, v);
        return 2;
      }
      j.nvswitch = !strcmp(v, "yes");
    } else if (!strcmp(o, "--codec-mbps")) {
      NEXT();
      if (agoq_args_parse_double(v, 1, 1e8, &codec_mbps) != 0) {
        fprintf(stderr, "%s: bad value for --codec-mbps: '%s' (MB/s, 1 to 100000000)\n", prog, v);
        return 2;
      }
    } else if (!strcmp(o, "--format")) {
      NEXT();
      formats = v;
    } else if (!strcmp(o, "--block")) {
      NEXT();
      block = (uint32_t)agoq_args_int_or_exit(prog, o, v, 32, 1024);
    } else {
      fprintf(stderr, "%s: unknown option '%s'\n", prog, o);
      usage(stderr);
      return 2;
    }
#undef NEXT
  }
  if (!have_model || j.hidden == 0 || j.vocab == 0 || j.seq == 0 || j.global_batch == 0 || j.tp == 0 ||
      j.pp == 0 || j.dp == 0 || j.nic_gbps <= 0) {
    fprintf(stderr, "%s: the model (--model or --layers/--hidden/--vocab), --seq, --global-batch, --tp, --pp, --dp "
                    "and --nic-gbps are required\n",
            prog);
    usage(stderr);
    return 2;
  }
  agoq_format fmt[8];
  int nfmt = 0;
  char list[128];
  snprintf(list, sizeof list, "%s", formats);
  for (char *save = NULL, *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
    if (nfmt == 8 || agoq_format_from_name(t, &fmt[nfmt]) != 0 || fmt[nfmt] == AGOQ_FORMAT_NONE) {
      fprintf(stderr, "%s: bad --format '%s' (up to 8 of int8, int4, fp8e4m3, fp8e5m2)\n", prog, t);
      return 2;
    }
    agoq_codec_params check = {.format = fmt[nfmt], .dtype = AGOQ_DTYPE_BF16, .block = block};
    if (agoq_codec_params_check(&check) != AGOQ_CODEC_OK) {
      fprintf(stderr, "%s: --block %u is not a block size agoq supports\n", prog, block);
      return 2;
    }
    nfmt++;
  }
  /* The codec speed is the tuner's own setting, read by the same parameter table, so that
   * the plan decides as the tuner would in a job started from this environment. */
  const char* codec_from = "--codec-mbps";
  if (codec_mbps <= 0.0) {
    if (agoq_params_load() != ncclSuccess) {
      fprintf(stderr, "%s: an AGOQ_* setting is invalid (reported above); fix it or give --codec-mbps\n", prog);
      return 2;
    }
    const char* which = NULL;
    codec_mbps = agoq_tuner_codec_setting(&which);
    bool gpu = strcmp(which, "AGOQ_CODEC_MBPS") != 0;
    bool dflt = !strcmp(agoq_param_source(gpu ? AGOQ_PARAM_GPU_CODEC_MBPS : AGOQ_PARAM_CODEC_MBPS), "default");
    codec_from = gpu ? (dflt ? "AGOQ_GPU_CODEC_MBPS's default (AGOQ_GPU=on, AGOQ_COLLNET_GPU=1)" : "AGOQ_GPU_CODEC_MBPS")
                     : (dflt ? "AGOQ_CODEC_MBPS's default" : "AGOQ_CODEC_MBPS");
  }
  agoq_plan_result r;
  char why[320];
  if (agoq_plan_compute(&j, &r, why, sizeof why) != 0) {
    fprintf(stderr, "%s: %s\n", prog, why);
    return 2;
  }

  printf("agoq-plan: a MODEL, not a measurement: bytes from the model's shapes and the layout, times at the\n"
         "NIC's line rate and the codec's set speed with nothing overlapped; real jobs add protocol overhead\n"
         "and overlap some of it.\n\n");
  printf("model    %.2f B parameters", r.params / 1e9);
  if (j.params_b > 0) printf(" (given; the shapes scaled to it)");
  printf(": %d layers, hidden %d, %d heads", j.layers, j.hidden, j.heads);
  if (j.kv_heads > 0 && j.kv_heads != j.heads) printf(" (%d K/V)", j.kv_heads);
  printf(", ffn %d%s, vocab %d%s\n", j.ffn_hidden > 0 ? j.ffn_hidden : 4 * j.hidden, j.swiglu ? " (SwiGLU)" : "",
         j.vocab, j.tied_embeddings ? " (tied)" : "");
  printf("layout   %lld GPUs on %d nodes of %d (NVSwitch %s); TP %d, PP %d, DP %d; distributed optimizer %s;\n"
         "         gradients reduced in %s\n",
         (long long)j.tp * j.pp * j.dp, r.nodes, j.gpus_per_node, j.nvswitch ? "yes" : "no", j.tp, j.pp, j.dp,
         j.dist_opt ? "on" : "off", j.grad_bytes == 4 ? "fp32" : "bf16");
  printf("batch    sequence %lld, micro batch %lld, global batch %lld: %lld micro-batches per pipeline\n", j.seq,
         j.micro_batch, j.global_batch, r.micro_batches);
  printf("per GPU  %.3f B parameters in the largest pipeline stage's share\n", r.params_per_gpu / 1e9);
  printf("codec    %g MB/s (%s): quantize + dequantize, the speed agoq's tuner costs\n\n", codec_mbps, codec_from);
  printf("per iteration, sent by the busiest node's NIC at %g Gbit/s (--nic-gbps, per node); a format's\n"
         "column is agoq's time where it compresses (wire + codec), else the exact time:\n",
         j.nic_gbps);
  printf("  %-15s %-33s %12s %10s", "group", "collective", "bytes", "time");
  for (int f = 0; f < nfmt; f++) printf(" %17s", agoq_format_name(fmt[f]));
  printf("\n");
  double total[8] = {0};
  agoq_plan_choice ch[AGOQ_PLAN_NGROUPS][8];
  for (int i = 0; i < AGOQ_PLAN_NGROUPS; i++) {
    const agoq_plan_group* g = &r.g[i];
    char b[32];
    gb(b, sizeof b, g->node_bytes);
    printf("  %-15s %-33s %12s %8.3f s", g->name, g->node_bytes > 0 || i != AGOQ_PLAN_TP ? g->collective : "(inside a node)",
           b, agoq_plan_seconds(&j, g->node_bytes));
    for (int f = 0; f < nfmt; f++) {
      agoq_plan_choice* c = &ch[i][f];
      agoq_plan_choose(&j, g, fmt[f], block, codec_mbps, c);
      total[f] += c->time_s;
      if (c->compressed)
        printf(" %9.3f s (%.2fx)", c->time_s, c->time_s / c->exact_s);
      else
        printf(" %9.3f s %7s", c->time_s, "exact");
    }
    printf("\n");
  }
  char b[32];
  gb(b, sizeof b, r.total_bytes);
  double exact_total = agoq_plan_seconds(&j, r.total_bytes);
  printf("  %-15s %-33s %12s %8.3f s", "total", "", b, exact_total);
  for (int f = 0; f < nfmt; f++) printf(" %9.3f s (%.2fx)", total[f], exact_total > 0 ? total[f] / exact_total : 1.0);
  printf("\n");

  /* Why each group that agoq could compress is, or is not, compressed. */
  bool header = false;
  for (int i = 0; i < AGOQ_PLAN_NGROUPS; i++) {
    const agoq_plan_group* g = &r.g[i];
    if (g->node_bytes <= 0 || g->path == AGOQ_PLAN_EXACT) continue;
    if (!header)
      printf("\nwhy (agoq's tuner's cost model, plugin/tuner/agoq_tuner_cost.c, on modelled NCCL estimates):\n");
    header = true;
    gb(b, sizeof b, g->codec_bytes);
    if (g->path == AGOQ_PLAN_NO_COLLNET) {
      printf("  %s: exact: %s\n", g->name, g->no_collnet);
      continue;
    }
    if (g->path == AGOQ_PLAN_P2P) {
      printf("  %s: typed p2p, no tuner (NCCL never asks it about send/recv): always compressed; codec: %s\n"
             "    per rank quantized and as much dequantized\n",
             g->name, b);
      for (int f = 0; f < nfmt; f++) {
        const agoq_plan_choice* c = &ch[i][f];
        printf("    %-7s %.3f s x %.3f = %.3f s + codec %.3f s = %.3f s against %.3f s exact\n",
               agoq_format_name(fmt[f]), c->exact_s, c->ratio, c->wire_s, c->codec_s, c->time_s, c->exact_s);
      }
      continue;
    }
    char cb[32];
    gb(cb, sizeof cb, g->comm_bytes);
    printf("  %s: the tuner sees one group's %s at the NIC's whole line rate (ring and CollNet alike;\n"
           "    %d groups share the NIC, which NCCL's estimate does not know) and costs the codec over %s per rank\n"
           "    twice (the contribution and the result)\n",
           g->name, cb, g->groups_on_node, b);
    if (g->tuner_as_bf16)
      printf("    (it is not told a ReduceScatter's type and costs it as bf16; the wire carries the real one)\n");
    for (int f = 0; f < nfmt; f++) {
      const agoq_tuner_estimate* e = &ch[i][f].tuner;
      printf("    %-7s CollNet %.3f s -> agoq's schedule at ratio %.3f %.3f s + codec %.3f s = %.3f s against the "
             "ring's %.3f s: %s\n",
             agoq_format_name(fmt[f]), e->collnet_us / 1e6, e->ratio, e->net_us / 1e6, e->codec_us / 1e6,
             e->agoq_us / 1e6, e->best_other_us / 1e6, e->compress ? "compressed on CollNet" : "NCCL's ring stays, exact");
    }
  }
  return 0;
}
