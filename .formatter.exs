[
  inputs: ["{mix,.formatter}.exs", "{config,lib,test,mix,bench,examples}/**/*.{ex,exs}"],
  line_length: 110
]
