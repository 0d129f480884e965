defmodule ExBurn.DevicesGuideTest do
  use ExUnit.Case, async: true
  use ExBurn.DocExamples, file: "guides/devices.md"
end
