; UNVERIFIED (never compiled here). Inno Setup 6 script for Hearth's per-user installer; run by
; packaging\windows\build.ps1, which passes AppVersion, SourceDir (the PyInstaller folder),
; OutputDir, IconFile and Backend with /D.
#ifndef AppVersion
  #error Pass /DAppVersion=X.Y.Z (build.ps1 does)
#endif

[Setup]
AppId={{5B0F7C9E-3D2A-4E61-9A8B-6C1D2E3F4A5B}
AppName=Hearth
AppVersion={#AppVersion}
AppVerName=Hearth {#AppVersion}
AppPublisher=Hearth developers
; per-user: no administrator rights, installed under the user's own programs folder
PrivilegesRequired=lowest
DefaultDirName={userpf}\Hearth
DisableProgramGroupPage=yes
DisableDirPage=auto
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#OutputDir}
OutputBaseFilename=hearth-{#AppVersion}-windows-x86_64-setup
SetupIconFile={#IconFile}
UninstallDisplayIcon={app}\hearthw.exe
UninstallDisplayName=Hearth {#AppVersion} ({#Backend})
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
; a running Hearth holds its files open: ask it to close first
CloseApplications=yes

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\Hearth"; Filename: "{app}\hearthw.exe"; Comment: "Run open LLMs locally"
Name: "{autodesktop}\Hearth"; Filename: "{app}\hearthw.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\hearthw.exe"; Description: "{cm:LaunchProgram,Hearth}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; the app folder only: models and settings (%LOCALAPPDATA%\Hearth) stay
Type: filesandordirs; Name: "{app}"
