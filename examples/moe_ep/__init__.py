"""The mixture-of-experts block of `examples/moe`, expert-parallel: experts sharded over
the devices of a mesh axis, tokens sent to the device that holds their expert and
back."""
