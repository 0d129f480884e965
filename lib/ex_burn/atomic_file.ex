defmodule ExBurn.AtomicFile do
  @moduledoc false
  # Files the library writes appear whole or not at all: the data goes to a temporary file beside
  # the target, which is then renamed over it (a rename within a directory is atomic on POSIX).

  @doc false
  @spec write(Path.t(), iodata) :: :ok | {:error, File.posix()}
  def write(path, data) do
    tmp = Path.join(Path.dirname(path), ".#{Path.basename(path)}.#{System.unique_integer([:positive])}.tmp")

    with :ok <- File.write(tmp, data),
         :ok <- File.rename(tmp, path) do
      :ok
    else
      error ->
        File.rm(tmp)
        error
    end
  end
end
