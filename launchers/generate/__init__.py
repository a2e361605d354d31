"""Generated artifacts: templates rendering, ma_pre_start.sh, the entrypoint, wheels and manifests."""
