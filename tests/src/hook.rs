//! A hook folder `<hook>/vgpu` laid out as `hami-device-plugin install-hook` leaves it, with
//! stand-in libraries (tests only check paths; no process loads them): `Allocate` refuses a
//! container whose preload list names files the folder lacks.

use std::path::Path;

/// Writes `libvgpu.so`, `libhami_preload.so` and the two-line `ld.so.preload` into `vgpu`
/// (created when missing).
pub fn install_stand_in(vgpu: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(vgpu)?;
    std::fs::write(vgpu.join("libvgpu.so"), b"\x7fELF stand-in HAMi-core")?;
    std::fs::write(vgpu.join("libhami_preload.so"), b"\x7fELF stand-in preload")?;
    std::fs::write(
        vgpu.join("ld.so.preload"),
        format!(
            "{dir}/libhami_preload.so\n{dir}/libvgpu.so\n",
            dir = vgpu.display()
        ),
    )
}
