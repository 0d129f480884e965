defmodule ExBurn.ConfigurationGuideTest do
  # The fast math example changes the VM-wide math mode (and sets it back).
  use ExUnit.Case, async: false
  use ExBurn.DocExamples, file: "guides/configuration.md"
end
