"""The decoding engine, apart from loading, costs and methods: the loop (`loop`), its rows (`rows`), the KV
caches (`cache`) and attention layouts (`architectures`), verification (`verification`, `tree`,
`width_groups`), sampling and coupled noise (`sampling`, `coupling`), how drafters are driven (`drafting`) and
the step clock (`clock`). It imports nothing from the methods."""
