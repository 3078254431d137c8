// Debug aid: print a native backtrace (module + offset) on SIGSEGV, for a device without gdb.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static void handler(int sig, siginfo_t *si, void *uc) {
  void *buf[80]; int n = backtrace(buf, 80); char m[512];
  int l = snprintf(m, sizeof m, "SEGV_TRACE signal %d addr %p frames %d\n", sig, si->si_addr, n); write(2, m, l);
  for (int i = 0; i < n; i++) {
    Dl_info d; memset(&d, 0, sizeof d);
    if (dladdr(buf[i], &d) && d.dli_fname)
      l = snprintf(m, sizeof m, "SEGV_TRACE #%d %s 0x%lx %s\n", i, d.dli_fname,
                   (unsigned long)((char *)buf[i] - (char *)d.dli_fbase), d.dli_sname ? d.dli_sname : "?");
    else l = snprintf(m, sizeof m, "SEGV_TRACE #%d %p\n", i, buf[i]);
    write(2, m, l);
  }
  signal(sig, SIG_DFL); raise(sig);
}
void install(void) {
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  static char stack[1 << 16]; stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0}; sigaltstack(&ss, 0);
  sigaction(SIGSEGV, &sa, 0); sigaction(SIGBUS, &sa, 0); sigaction(SIGABRT, &sa, 0);
}
