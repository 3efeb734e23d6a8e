//! Inventory files (the device plugin's GPU list without NVML) that several tests start from.

/// Two H200s on two NUMA nodes.
pub const TWO_H200: &str = "
- uuid: GPU-11111111-aaaa-4000-8000-000000000001
  name: NVIDIA H200
  memoryMib: 143771
  numaNode: 0
- uuid: GPU-22222222-bbbb-4000-8000-000000000002
  name: NVIDIA H200
  memoryMib: 143771
  numaNode: 1
";

/// One H200.
pub const ONE_H200: &str = "- {uuid: GPU-aaaa, name: NVIDIA H200, memoryMib: 143771}\n";
