"""Running the MoE on a machine: the persistent worker pool (one group per NUMA node), the
topology and the experts' split over groups, the hand-over flags with the GPU, the driver of a
whole step's layers, the background compile of a first start, and latency/bandwidth probes."""
