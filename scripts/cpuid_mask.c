// LD_PRELOAD library that hides AVX-512 (and AMX) from every CPUID the process runs, so one
// benchmark invocation (ExBurn, PyTorch, ggml, and whatever else they start) picks the code
// paths an x86-64-v3 CPU would run. It uses Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID,
// cpuinfo flag `cpuid_fault`): each CPUID traps to a SIGSEGV handler that runs the real
// instruction and clears the hidden bits. Run it through scripts/without_avx512.sh.
//
// A handler the program installs for SIGSEGV (rustc, Rust's stack-overflow guard) is kept aside
// and called for every other fault. Limits: glibc picks its string functions before this library
// loads (the wrapper sets GLIBC_TUNABLES for those), and code compiled with AVX-512 enabled
// still runs it.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static int set_cpuid(int on) { return (int)syscall(SYS_arch_prctl, ARCH_SET_CPUID, on); }

static void hide(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  // r: eax, ebx, ecx, edx
  if (leaf == 7 && sub == 0) {
    // ebx: avx512 f dq ifma pf er cd bw vl
    r[1] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) |
              (1u << 30) | (1u << 31));
    // ecx: avx512 vbmi vbmi2 vnni bitalg vpopcntdq
    r[2] &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    // edx: avx512 4vnniw 4fmaps vp2intersect fp16; amx bf16 tile int8
    r[3] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) |
              (1u << 25));
  } else if (leaf == 7 && sub == 1) {
    // eax: avx512_bf16; amx fp16 (21)
    r[0] &= ~((1u << 5) | (1u << 21));
  }
}

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
// The program's own SIGSEGV disposition, as it last set it (SIG_DFL until it does).
static struct sigaction theirs;

static void on_segv(int sig, siginfo_t *info, void *raw) {
  ucontext_t *uc = raw;
  greg_t *g = uc->uc_mcontext.gregs;
  const uint8_t *ip = (const uint8_t *)g[REG_RIP];
  if (ip[0] != 0x0f || ip[1] != 0xa2) {
    // A real fault: the program's handler if it has one, else die as it would have.
    if (theirs.sa_flags & SA_SIGINFO) {
      theirs.sa_sigaction(sig, info, raw);
    } else if (theirs.sa_handler != SIG_DFL && theirs.sa_handler != SIG_IGN) {
      theirs.sa_handler(sig);
    } else {
      struct sigaction dfl;
      memset(&dfl, 0, sizeof dfl);
      dfl.sa_handler = SIG_DFL;
      real_sigaction(sig, &dfl, NULL);
    }
    return;
  }
  uint32_t leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX], r[4];
  set_cpuid(1);
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
  set_cpuid(0);
  hide(leaf, sub, r);
  g[REG_RAX] = r[0];
  g[REG_RBX] = r[1];
  g[REG_RCX] = r[2];
  g[REG_RDX] = r[3];
  g[REG_RIP] += 2;
  (void)info;
}

// SIGSEGV stays ours: what the program asks for is recorded and reported back to it.
int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  if (sig != SIGSEGV) return real_sigaction(sig, act, old);
  if (old) *old = theirs;
  if (act) theirs = *act;
  return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act, old;
  memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  act.sa_flags = SA_RESTART;
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}

__attribute__((constructor)) static void start(void) {
  if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  theirs.sa_handler = SIG_DFL;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  // On the alternate stack where the thread has one, so stack overflows still reach the program.
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (real_sigaction(SIGSEGV, &sa, NULL) != 0 || set_cpuid(0) != 0) {
    fprintf(stderr, "cpuid_mask: this CPU or kernel has no CPUID faulting; AVX-512 is not hidden\n");
    exit(70);
  }
}
