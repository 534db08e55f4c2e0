/*
 * The library must load in old images (CentOS 7, Ubuntu 18.04, RHEL 8: glibc 2.17 to 2.28), as
 * manylinux2014 wheels do, whatever glibc builds it. Force-included into every source of the
 * library (Makefile): each C library function whose default version is newer than glibc 2.17 is
 * bound to its old version (still exported by every newer glibc for old binaries), and fstat
 * (a 2.33 symbol; older glibcs inline it to __fxstat) goes to the system call.
 * tests/isolation/test_glibc_baseline.py reads the built library's version needs.
 */
#ifndef TESSERA_GLIBC_COMPAT_H
#define TESSERA_GLIBC_COMPAT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#if defined(__GLIBC__) || defined(__linux__)
#if defined(__x86_64__)
#define TS_GLIBC_BASE "GLIBC_2.2.5"
#define TS_GLIBC_ROBUST "GLIBC_2.12"
#elif defined(__aarch64__)
#define TS_GLIBC_BASE "GLIBC_2.17"
#define TS_GLIBC_ROBUST "GLIBC_2.17"
#endif

#ifdef TS_GLIBC_BASE
__asm__(".symver dlerror,dlerror@" TS_GLIBC_BASE);
__asm__(".symver dladdr,dladdr@" TS_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" TS_GLIBC_BASE);
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@" TS_GLIBC_BASE);
__asm__(".symver pthread_mutex_timedlock,pthread_mutex_timedlock@" TS_GLIBC_BASE);
__asm__(".symver pthread_mutexattr_init,pthread_mutexattr_init@" TS_GLIBC_BASE);
__asm__(".symver pthread_mutexattr_destroy,pthread_mutexattr_destroy@" TS_GLIBC_BASE);
__asm__(".symver pthread_mutexattr_setpshared,pthread_mutexattr_setpshared@" TS_GLIBC_BASE);
__asm__(".symver pthread_mutexattr_setrobust,pthread_mutexattr_setrobust@" TS_GLIBC_ROBUST);
__asm__(".symver pthread_mutex_consistent,pthread_mutex_consistent@" TS_GLIBC_ROBUST);
#endif

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
static inline int ts_fstat(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }
#define fstat(fd, st) ts_fstat(fd, st)
#endif

#endif
