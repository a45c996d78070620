"""The only code that speaks a vendor's API.

`providers.vast` and `providers.runpod` are the real adapters (httpx, no vendor SDK),
`providers.sim` is the simulated marketplace, `providers.fakes` are fake vendor servers on
loopback for tests and the demo. Every adapter implements `app.market.Market` and translates
vendor errors into `app.market.MarketError`. Adapters are built in `app.bootstrap.market`.

Nothing is imported here: importing `providers` must stay free.
"""
