defmodule ExBurn.Model.GuideTest do
  # The training guide builds one example step by step: its blocks share variables, in order.
  use ExUnit.Case, async: false
  use ExBurn.DocExamples, file: "guides/training.md", shared: true, min_blocks: 8, min_assertions: 15
end
