"""Layer 5: offline data preparation: download, formatting, sharding, instances and HDF5 shards, vocab training,
on local processes, Dask or Slurm."""
