[
  inputs: ["{mix,.formatter}.exs", "{config,lib,test,mix,bench,examples}/**/*.{ex,exs}"],
  line_length: 110,
  # Nx's formatter config is only importable when Nx is a dependency; defn is written like def
  locals_without_parens: [defn: 1, defn: 2, defnp: 1, defnp: 2, deftransform: 2, deftransformp: 2]
]
