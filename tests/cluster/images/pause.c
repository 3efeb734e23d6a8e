/*
 * The pod sandbox ("pause") process of the local test images (scripts/images): it holds the pod's
 * namespaces and does nothing else. SIGINT and SIGTERM end it with status 0; SIGCHLD reaps every
 * exited child (it is PID 1 of the pod when the PID namespace is shared); otherwise it sleeps in
 * pause() forever. Built with `gcc -static -O2`, so the image needs no libc.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int on(int sig, void (*handler)(int)) {
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(void) {
    if (on(SIGINT, stop) != 0 || on(SIGTERM, stop) != 0 || on(SIGCHLD, reap) != 0) {
        static const char msg[] = "pause: sigaction failed\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
        return 1;
    }
    for (;;) {
        pause();
    }
}
