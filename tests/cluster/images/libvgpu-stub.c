/*
 * A stand-in for HAMi-core's libvgpu.so in the local HAMi image (scripts/images): a shared object
 * that loads harmlessly into any process, through ld.so.preload or LD_PRELOAD. It has no
 * constructor, prints nothing, intercepts nothing and needs no library (built with -nostdlib, so it
 * loads whatever the process's glibc version is). Tests find it by its one exported symbol.
 */
__attribute__((visibility("default"))) const char hami_limits_libvgpu_stub_version[] =
    "hami-limits libvgpu stub";

__attribute__((visibility("default"))) int hami_limits_libvgpu_stub(void) {
    return 0;
}
