defmodule ExBurn.PretrainedGuideTest do
  use ExUnit.Case, async: false
  import ExBurn.PretrainedCase

  reason =
    skip_unless_installed(:embedding, "all-minilm-l6-v2") ||
      skip_unless_installed(:llm, "smollm2-135m-instruct")

  if reason, do: @moduletag(skip: reason)

  use ExBurn.DocExamples, file: "guides/pretrained.md", shared: true, min_blocks: 8, min_assertions: 12
end
