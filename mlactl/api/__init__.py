"""mlactl from Python: the main jobs as functions that return the results the CLI renders.

    import mlactl

    a = mlactl.analyze("deepseek-v3", "h200", new=[1, 256, 4096], prefix=[0, 32768])
    a.to_json()["rows"][0]["best"]      # 'expand' (the same document as `--format json`)
    a.to_pandas()                       # the same table as `--format csv`, as a DataFrame

Every function takes the settings the commands take, by the same names (`tp`, `kv_dtype`,
`calibration`, `engines`, `engine_options`, ...); a setting left as None resolves exactly as an
option the user did not type (mlactl.decide.setup). Shapes are a number, a list, or the CLI's
text (`"1:4096:*2"`, `"0,8K,32K"`). Bad input raises mlactl.MlactlError with the one line the CLI
would print. Importing mlactl loads none of torch, triton or matplotlib; `to_pandas` imports
pandas when it is called.

The functions live one job a module (grid, batch, engines, replay), so a command imports only
its own; `mlactl.analyze` and the rest reach them through mlactl/__init__.py.
"""
